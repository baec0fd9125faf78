//! Strict RFC 8259 parsing that builds the value in the same pass.
//!
//! One parser, generic over a [`Builder`]: the Python face's builder makes Python objects
//! (`parse_json`), and [`ValueBuilder`](crate::value::ValueBuilder) makes a pure-Rust
//! [`Value`](crate::value::Value) for the Rust tests and the fuzz checks. The parser
//! drives jiter's low-level [`Jiter`] with an explicit stack of open containers, so nesting costs
//! heap, never native stack, and it stops at `max_depth` (and at [`DEPTH_CAP`] whatever the caller
//! asks). [`check_value`] runs the same parser, building nothing, over one value inside a text
//! another reader is going through (the envelope's fields it does not read): one rule, one place.
//!
//! Strict means: any JSON value at the root and only whitespace after it; no duplicate key in any
//! object; no `NaN`/`Infinity`; every number one exact value (below); UTF-8 only, with no lone
//! surrogate escape; no byte-order mark.
//!
//! A number means one thing, its exact decimal value, however it is spelt (digits, a fraction,
//! an exponent, trailing zeros): an integer value within [-2^63, 2^64-1] is that integer (an
//! `int`, `1e4` and `10000.0` alike); any other value is taken only when it is the shortest
//! round-trip decimal of a finite double (as Python's `repr` writes it, ties to even), and is that
//! double, which names it exactly. Everything else (`0.99999999999999999`, `3e28`, `1e400`,
//! `1e-400`, an integer past 64 bits) is refused, `inexact_number`: judged as a double it would
//! be another value than the text that is passed on. A rejection is a [`Failure`]: a code, a message that says what and where
//! (line, column) without echoing the text, and the JSON Pointer (RFC 6901) of the offending
//! member or element.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt::Write as _;

use jiter::{
    Jiter, JiterError, JiterErrorType, JsonErrorType, LinePosition, NumberAny, NumberInt, Peek,
};
use smallvec::SmallVec;

/// The deepest nesting any JSON callgate reads or writes may have (arguments, envelopes, vendor
/// records, tool results): every parser stops there with its own rejection, and every encoder
/// writes that deep (orjson's own limit is 254 levels). Python reads this one definition as
/// `worker.model.MAX_DEPTH`.
pub const MAX_DEPTH: usize = 254;

/// The deepest nesting the parser ever opens, whatever `max_depth` says: a bound on the stack it
/// keeps and on the recursion of anything that later walks the value.
pub const DEPTH_CAP: usize = 1024;

const INEXACT: &str =
    "a number is neither a 64-bit integer nor the shortest form of a double: it would change value";

/// What a failure says of a text that stops before its value ends (more text might mend it).
pub const UNFINISHED: &str = "the text ends before the JSON value does";

/// Why a text is rejected: the `code` of a `ParseError` (the Python face's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Code {
    InvalidJson,
    DuplicateKey,
    NonFiniteNumber,
    InexactNumber,
    InvalidUtf8,
    TooDeep,
}

impl Code {
    pub const ALL: [Code; 6] = [
        Code::InvalidJson,
        Code::DuplicateKey,
        Code::NonFiniteNumber,
        Code::InexactNumber,
        Code::InvalidUtf8,
        Code::TooDeep,
    ];

    /// The code named `name` (its `as_str`), if there is one.
    pub fn parse(name: &str) -> Option<Code> {
        Code::ALL.into_iter().find(|known| known.as_str() == name)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Code::InvalidJson => "invalid_json",
            Code::DuplicateKey => "duplicate_key",
            Code::NonFiniteNumber => "non_finite_number",
            Code::InexactNumber => "inexact_number",
            Code::InvalidUtf8 => "invalid_utf8",
            Code::TooDeep => "too_deep",
        }
    }
}

/// A rejected text: what is wrong, where, and the JSON Pointer of the offending value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Failure {
    pub code: Code,
    pub message: String,
    pub path: String,
}

/// Why a parse stopped: the text is not strict JSON, or the builder failed (out of memory).
#[derive(Debug)]
pub enum Stop<E> {
    Invalid(Failure),
    Build(E),
}

/// Makes the values the parser finds. Containers are built as they are parsed: `array`/`object`
/// open one, `push`/`insert` fill it, `end_array`/`end_object` close it into a value. Only the
/// steps that can run out of memory in Python are fallible.
pub trait Builder {
    type Value;
    type Key;
    type Array;
    type Object;
    type Error;

    fn null(&mut self) -> Self::Value;
    fn bool(&mut self, value: bool) -> Self::Value;
    fn int(&mut self, value: i64) -> Self::Value;
    /// An integer above `i64::MAX`.
    fn uint(&mut self, value: u64) -> Self::Value;
    /// Always finite.
    fn float(&mut self, value: f64) -> Self::Value;
    fn string(&mut self, value: &str) -> Self::Value;
    fn key(&mut self, key: &str) -> Self::Key;
    fn array(&mut self) -> Self::Array;
    fn push(&mut self, array: &mut Self::Array, value: Self::Value);
    fn end_array(&mut self, array: Self::Array) -> Result<Self::Value, Self::Error>;
    fn object(&mut self) -> Self::Object;
    /// Adds a member; `Ok(false)` when the object already had the key.
    fn insert(
        &mut self,
        object: &mut Self::Object,
        key: &Self::Key,
        value: Self::Value,
    ) -> Result<bool, Self::Error>;
    fn end_object(&mut self, object: Self::Object) -> Self::Value;
    /// A key's text, for the JSON Pointer of a rejection (cold path).
    fn key_text(key: &Self::Key) -> Cow<'_, str>;
}

/// Parses `data` as one strict JSON value nesting at most `max_depth` containers deep.
pub fn parse<B: Builder>(
    data: &[u8],
    max_depth: usize,
    builder: &mut B,
) -> Result<B::Value, Stop<B::Error>> {
    let mut jiter = Jiter::new(data);
    let mut parser = Parser::new(data, &mut jiter, builder, max_depth);
    let done = parser
        .value()
        .and_then(|value| parser.finish().map(|()| value));
    match done {
        Ok(value) => Ok(value),
        Err(Halt) => Err(match parser.stopped() {
            Stop::Invalid(failure) => Stop::Invalid(utf8_first(data, failure)),
            build => build,
        }),
    }
}

/// Checks the one JSON value at `jiter`'s current position as strictly as [`parse`] checks a
/// whole text (no duplicate key, no `NaN`/`Infinity`, numbers a double or a 64-bit integer holds,
/// valid UTF-8 with no lone surrogate escape), nesting at most `max_depth` containers deep, and
/// builds nothing. On success `jiter` stands just past the value, and what follows is the
/// caller's to read. `data` is the text `jiter` reads: a failure is located in it, and its path
/// is relative to the value. A failure is not reclassified by what the rest of `data` holds, as
/// [`parse`] reclassifies any failure in a text that is not UTF-8.
pub fn check_value<'j>(
    jiter: &mut Jiter<'j>,
    data: &'j [u8],
    max_depth: usize,
) -> Result<(), Failure> {
    let mut checker = Checker;
    let mut parser = Parser::new(data, jiter, &mut checker, max_depth);
    match parser.value() {
        Ok(()) => Ok(()),
        Err(Halt) => match parser.stopped() {
            Stop::Invalid(failure) => Err(failure),
            Stop::Build(never) => match never {},
        },
    }
}

/// A text that is not UTF-8 is rejected as `invalid_utf8`, whatever else is wrong with it. A
/// parse that succeeds has checked every byte (only strings may hold non-ASCII bytes), so the
/// text is checked as a whole only on the way out of a failed parse.
pub(crate) fn utf8_first(data: &[u8], failure: Failure) -> Failure {
    if failure.code == Code::InvalidUtf8 {
        return failure;
    }
    match std::str::from_utf8(data) {
        Ok(_) => failure,
        Err(error) => Failure {
            code: Code::InvalidUtf8,
            message: located("the text is not valid UTF-8", data, error.valid_up_to()),
            path: String::new(),
        },
    }
}

fn located(what: &str, data: &[u8], index: usize) -> String {
    let LinePosition { line, column } = LinePosition::find(data, index);
    format!("{what} (line {line}, column {column})")
}

/// An open container: what is built so far and which member or element is being parsed.
enum Frame<B: Builder> {
    Array {
        array: B::Array,
        index: usize,
    },
    Object {
        object: B::Object,
        key: B::Key,
        /// where the search for the current key's opening quote starts (for a duplicate's place)
        key_from: usize,
    },
}

/// The parse stopped; why is in [`Parser::stop`]. Zero-sized, so every step's `Result` is as
/// small as its value.
struct Halt;

type Step<T> = Result<T, Halt>;

struct Parser<'j, 'p, B: Builder> {
    data: &'j [u8],
    jiter: &'p mut Jiter<'j>,
    builder: &'p mut B,
    stack: SmallVec<[Frame<B>; 8]>,
    max_depth: usize,
    stop: Option<Stop<B::Error>>,
}

impl<'j, 'p, B: Builder> Parser<'j, 'p, B> {
    fn new(data: &'j [u8], jiter: &'p mut Jiter<'j>, builder: &'p mut B, max_depth: usize) -> Self {
        Parser {
            data,
            jiter,
            builder,
            stack: SmallVec::new(),
            max_depth: max_depth.min(DEPTH_CAP),
            stop: None,
        }
    }

    /// Why the parse halted.
    #[cold]
    fn stopped(&mut self) -> Stop<B::Error> {
        let stop = self.stop.take();
        debug_assert!(stop.is_some(), "a halt always says why");
        stop.unwrap_or_else(|| {
            Stop::Invalid(Failure {
                code: Code::InvalidJson,
                message: located("the text is not valid JSON", self.data, 0),
                path: String::new(),
            })
        })
    }

    /// After the root value: only whitespace may follow.
    fn finish(&mut self) -> Step<()> {
        match self.jiter.finish() {
            Ok(()) => Ok(()),
            Err(error) => Err(self.jiter_failure(&error, true)),
        }
    }

    /// The one value at the current position, nested containers and all.
    fn value(&mut self) -> Step<B::Value> {
        let mut peek = match self.jiter.peek() {
            Ok(peek) => peek,
            Err(error) => return Err(self.jiter_failure(&error, true)),
        };
        'value: loop {
            let mut value = match peek {
                Peek::Array => {
                    self.enter()?;
                    match self.jiter.known_array() {
                        Ok(Some(first)) => {
                            let array = self.builder.array();
                            self.stack.push(Frame::Array { array, index: 0 });
                            peek = first;
                            continue 'value;
                        }
                        Ok(None) => {
                            let array = self.builder.array();
                            self.end_array(array)?
                        }
                        Err(error) => return Err(self.jiter_failure(&error, true)),
                    }
                }
                Peek::Object => {
                    self.enter()?;
                    let key_from = self.jiter.current_index();
                    match self.jiter.known_object() {
                        Ok(Some(key)) => {
                            let key = self.builder.key(key);
                            let object = self.builder.object();
                            self.stack.push(Frame::Object {
                                object,
                                key,
                                key_from,
                            });
                            peek = self.member_peek()?;
                            continue 'value;
                        }
                        Ok(None) => {
                            let object = self.builder.object();
                            self.builder.end_object(object)
                        }
                        Err(error) => return Err(self.jiter_failure(&error, true)),
                    }
                }
                _ => self.scalar(peek)?,
            };
            // `value` is complete: add it to the open container, then go on to the next member
            // or element, or close the container and add it to its own parent in turn.
            loop {
                match self.stack.last_mut() {
                    None => return Ok(value),
                    Some(Frame::Array { array, index }) => {
                        self.builder.push(array, value);
                        match self.jiter.array_step() {
                            Ok(Some(next)) => {
                                *index += 1;
                                peek = next;
                                continue 'value;
                            }
                            Ok(None) => {}
                            Err(error) => return Err(self.jiter_failure(&error, false)),
                        }
                    }
                    Some(Frame::Object {
                        object,
                        key,
                        key_from,
                    }) => {
                        match self.builder.insert(object, key, value) {
                            Ok(true) => {}
                            Ok(false) => {
                                let from = *key_from;
                                return Err(self.duplicate(from));
                            }
                            Err(error) => return Err(self.build_failure(error)),
                        }
                        *key_from = self.jiter.current_index();
                        match self.jiter.next_key() {
                            Ok(Some(next)) => {
                                *key = self.builder.key(next);
                                peek = self.member_peek()?;
                                continue 'value;
                            }
                            Ok(None) => {}
                            Err(error) => return Err(self.jiter_failure(&error, false)),
                        }
                    }
                }
                value = match self.stack.pop() {
                    Some(Frame::Array { array, .. }) => self.end_array(array)?,
                    Some(Frame::Object { object, .. }) => self.builder.end_object(object),
                    None => unreachable!("a container was open"),
                };
            }
        }
    }

    /// Before opening a container: one more level must fit under the limit.
    fn enter(&mut self) -> Step<()> {
        if self.stack.len() < self.max_depth {
            return Ok(());
        }
        let what = format!("the text nests deeper than {} levels", self.max_depth);
        let at = self.jiter.current_index();
        Err(self.failure(Code::TooDeep, &what, at, true))
    }

    fn end_array(&mut self, array: B::Array) -> Step<B::Value> {
        match self.builder.end_array(array) {
            Ok(value) => Ok(value),
            Err(error) => Err(self.build_failure(error)),
        }
    }

    /// The start of a member's value, just after its key and colon.
    fn member_peek(&mut self) -> Step<Peek> {
        match self.jiter.peek() {
            Ok(peek) => Ok(peek),
            Err(error) => Err(self.jiter_failure(&error, true)),
        }
    }

    fn scalar(&mut self, peek: Peek) -> Step<B::Value> {
        let done = match peek {
            Peek::String => match self.jiter.known_str() {
                Ok(value) => return Ok(self.builder.string(value)),
                Err(error) => error,
            },
            Peek::Null => match self.jiter.known_null() {
                Ok(()) => return Ok(self.builder.null()),
                Err(error) => error,
            },
            Peek::True | Peek::False => match self.jiter.known_bool(peek) {
                Ok(value) => return Ok(self.builder.bool(value)),
                Err(error) => error,
            },
            _ => return self.number(peek),
        };
        Err(self.jiter_failure(&done, true))
    }

    fn number(&mut self, peek: Peek) -> Step<B::Value> {
        let start = self.jiter.current_index();
        let rest = &self.data[start..];
        let non_finite = match peek {
            Peek::NaN => rest.starts_with(b"NaN"),
            Peek::Infinity => rest.starts_with(b"Infinity"),
            Peek::Minus => rest.get(1) == Some(&b'I') && rest.starts_with(b"-Infinity"),
            _ => false,
        };
        if non_finite {
            let what = "NaN and Infinity are not JSON numbers";
            return Err(self.failure(Code::NonFiniteNumber, what, start, true));
        }
        match self.jiter.known_number(peek) {
            Ok(NumberAny::Int(NumberInt::Int(value))) => Ok(self.builder.int(value)),
            Ok(_) => {
                let end = self.jiter.current_index();
                self.exact(start, end)
            }
            Err(error) if is(&error, &JsonErrorType::NumberOutOfRange) => {
                match self.jiter.known_number_bytes(peek) {
                    Ok(_) => {
                        let end = self.jiter.current_index();
                        self.exact(start, end)
                    }
                    Err(_) => Err(self.failure(Code::InexactNumber, INEXACT, start, true)),
                }
            }
            Err(error) => Err(self.jiter_failure(&error, true)),
        }
    }

    /// A number that is not a plain `i64`: its exact value, by the rule for numbers.
    #[cold]
    fn exact(&mut self, start: usize, end: usize) -> Step<B::Value> {
        match exact_number(&self.data[start..end]) {
            Some(Exact::Int(value)) => Ok(self.builder.int(value)),
            Some(Exact::Uint(value)) => Ok(self.builder.uint(value)),
            Some(Exact::Float(value)) => Ok(self.builder.float(value)),
            None => Err(self.failure(Code::InexactNumber, INEXACT, start, true)),
        }
    }

    #[cold]
    fn duplicate(&mut self, key_from: usize) -> Halt {
        let quote = self.data[key_from..]
            .iter()
            .position(|&byte| byte == b'"')
            .map_or(key_from, |offset| key_from + offset);
        let what = "an object has the same key twice";
        self.failure(Code::DuplicateKey, what, quote, true)
    }

    #[cold]
    fn build_failure(&mut self, error: B::Error) -> Halt {
        self.stop = Some(Stop::Build(error));
        Halt
    }

    #[cold]
    fn jiter_failure(&mut self, error: &JiterError, at_member: bool) -> Halt {
        let kind = match &error.error_type {
            JiterErrorType::JsonError(kind) => kind,
            JiterErrorType::WrongType { .. } => &JsonErrorType::ExpectedSomeValue,
        };
        let (code, what) = describe(kind);
        let what = match kind {
            JsonErrorType::EofWhileParsingValue
                if self
                    .data
                    .iter()
                    .all(|byte| matches!(byte, b' ' | b'\t' | b'\n' | b'\r')) =>
            {
                "the text is empty"
            }
            JsonErrorType::ExpectedSomeValue
                if error.index == 0 && self.data.starts_with(b"\xEF\xBB\xBF") =>
            {
                "the text starts with a byte-order mark"
            }
            _ => what,
        };
        self.failure(code, what, error.index, at_member)
    }

    /// Records a rejection located at `index`, with the pointer of the value being parsed
    /// (`at_member`) or of the container it is in (an error between members or elements).
    #[cold]
    fn failure(&mut self, code: Code, what: &str, index: usize, at_member: bool) -> Halt {
        let open = if at_member {
            &self.stack[..]
        } else {
            &self.stack[..self.stack.len().saturating_sub(1)]
        };
        let mut path = String::new();
        for frame in open {
            path.push('/');
            match frame {
                Frame::Array { index, .. } => {
                    let _ = write!(path, "{index}");
                }
                Frame::Object { key, .. } => escape_token(&B::key_text(key), &mut path),
            }
        }
        self.stop = Some(Stop::Invalid(Failure {
            code,
            message: located(what, self.data, index),
            path,
        }));
        Halt
    }
}

/// The value a JSON number text stands for, when the rule for numbers takes it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Exact {
    Int(i64),
    /// above `i64::MAX`
    Uint(u64),
    /// never integral, and always the double whose shortest form the text is
    Float(f64),
}

/// A number text as `digits * 10^exponent`, digits without leading or trailing zeros (empty for
/// zero), the exponent saturated far past any value the rule takes.
struct Decimal {
    negative: bool,
    digits: Vec<u8>,
    exponent: i64,
}

impl Decimal {
    /// `text` is a JSON number (the parser checked its grammar).
    fn of(text: &[u8]) -> Decimal {
        let negative = text.first() == Some(&b'-');
        let body = if negative { &text[1..] } else { text };
        let mantissa_end = body
            .iter()
            .position(|b| matches!(b, b'e' | b'E'))
            .unwrap_or(body.len());
        let (mantissa, exponent_text) = body.split_at(mantissa_end);
        let mut exponent: i64 = 0;
        if let Some((_, written)) = exponent_text.split_first() {
            let (sign, digits) = match written.first() {
                Some(b'-') => (-1, &written[1..]),
                Some(b'+') => (1, &written[1..]),
                _ => (1, written),
            };
            for digit in digits {
                exponent = (exponent * 10 + i64::from(digit - b'0')).min(1 << 40);
            }
            exponent *= sign;
        }
        let mut digits = Vec::with_capacity(mantissa.len());
        for &byte in mantissa {
            match byte {
                b'.' => {}
                digit => digits.push(digit - b'0'),
            }
        }
        let fraction = mantissa
            .iter()
            .position(|&b| b == b'.')
            .map_or(0, |dot| mantissa.len() - dot - 1);
        exponent -= fraction as i64;
        let leading = digits.iter().take_while(|&&d| d == 0).count();
        digits.drain(..leading);
        while digits.last() == Some(&0) {
            digits.pop();
            exponent += 1;
        }
        Decimal {
            negative,
            digits,
            exponent,
        }
    }
}

/// The rule for numbers (module docs): the value `text` stands for, or None when it is refused.
pub fn exact_number(text: &[u8]) -> Option<Exact> {
    let Decimal {
        negative,
        digits,
        exponent,
    } = Decimal::of(text);
    if digits.is_empty() {
        return Some(Exact::Int(0));
    }
    let count = digits.len() as i64;
    if exponent >= 0 {
        // an integer: within 64 bits it has at most 20 digits
        if count + exponent > 20 {
            return None;
        }
        let mut magnitude: u128 = 0;
        for &digit in &digits {
            magnitude = magnitude * 10 + u128::from(digit);
        }
        magnitude *= 10u128.pow(exponent as u32);
        return if negative {
            (magnitude <= 1u128 << 63).then(|| Exact::Int((-(magnitude as i128)) as i64))
        } else if magnitude <= i64::MAX as u128 {
            Some(Exact::Int(magnitude as i64))
        } else {
            u64::try_from(magnitude).ok().map(Exact::Uint)
        };
    }
    // not an integer: a double's shortest form has at most 17 digits, and no double is below
    // 5e-324
    if count > 17 || count + exponent < -400 {
        return None;
    }
    let text = std::str::from_utf8(text).ok()?;
    let double: f64 = text.parse().ok()?;
    let (shortest, at) = shortest_digits(double.abs())?;
    let mantissa = digits.iter().fold(0u64, |n, &d| n * 10 + u64::from(d));
    (mantissa == shortest && exponent == at).then_some(Exact::Float(double))
}

/// A finite, non-integral double as the shortest decimal the rule for numbers reads back as it
/// (its `shortest_digits`), e.g. `-1e-1`; None for any other double.
pub fn shortest_text(double: f64) -> Option<String> {
    if double.fract() == 0.0 {
        return None;
    }
    let (digits, exponent) = shortest_digits(double.abs())?;
    let sign = if double < 0.0 { "-" } else { "" };
    Some(format!("{sign}{digits}e{exponent}"))
}

/// The shortest decimal `digits * 10^exponent` (digits without trailing zeros) that reads back as
/// the finite, positive, non-integral `double`, as Python's `repr` chooses it: of two equally
/// short and equally near, the even one (Rust's formatting takes the upper).
fn shortest_digits(double: f64) -> Option<(u64, i64)> {
    if !double.is_finite() || double == 0.0 {
        return None;
    }
    let written = format!("{double:e}");
    let (mantissa, exponent) = written.split_once('e')?;
    let exponent: i64 = exponent.parse().ok()?;
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let at = exponent - (digits.len() as i64 - 1);
    let shortest: u64 = digits.parse().ok()?;
    // a tie: the double lies exactly halfway between `shortest` and a neighbour of as many
    // digits; its exact value, odd_part * 10^-k, then has one digit more, ending in 5
    let Some((odd_part, k)) = exact_fraction(double) else {
        return Some((shortest, at));
    };
    if at - 1 != -k || odd_part % 10 != 5 {
        return Some((shortest, at));
    }
    let below = u64::try_from(odd_part / 10).ok()?;
    let even = if below % 2 == 0 { below } else { below + 1 };
    if even == shortest || even == 0 {
        return Some((shortest, at));
    }
    // the even neighbour reads back as the same double (it is as near as `shortest`)
    let candidate: f64 = format!("{even}e{at}").parse().ok()?;
    Some(if candidate == double {
        (even, at)
    } else {
        (shortest, at)
    })
}

/// A positive non-integral double's exact value as `odd_part * 10^-k`, `odd_part` not a
/// multiple of 10, when it has at most 38 digits (else None: no tie of a 17-digit form).
fn exact_fraction(double: f64) -> Option<(u128, i64)> {
    let bits = double.to_bits();
    let biased = ((bits >> 52) & 0x7ff) as i64;
    let fraction = bits & ((1u64 << 52) - 1);
    let (mut mantissa, mut power) = if biased == 0 {
        (fraction, -1074)
    } else {
        (fraction | (1u64 << 52), biased - 1075)
    };
    let zeros = mantissa.trailing_zeros();
    mantissa >>= zeros;
    power += i64::from(zeros);
    if power >= 0 {
        return None;
    }
    // mantissa * 2^power = mantissa * 5^-power * 10^power
    let k = -power;
    let five = 5u128.checked_pow(u32::try_from(k).ok()?)?;
    let odd_part = u128::from(mantissa).checked_mul(five)?;
    Some((odd_part, k))
}

fn is(error: &JiterError, kind: &JsonErrorType) -> bool {
    matches!(&error.error_type, JiterErrorType::JsonError(found) if found == kind)
}

fn describe(kind: &JsonErrorType) -> (Code, &'static str) {
    use JsonErrorType as E;
    let what = match kind {
        E::InvalidUnicodeCodePoint => return (Code::InvalidUtf8, "a string is not valid UTF-8"),
        E::LoneLeadingSurrogateInHexEscape | E::UnexpectedEndOfHexEscape => {
            return (
                Code::InvalidUtf8,
                "a string escapes a lone UTF-16 surrogate",
            );
        }
        E::EofWhileParsingList
        | E::EofWhileParsingObject
        | E::EofWhileParsingString
        | E::EofWhileParsingValue => UNFINISHED,
        E::ExpectedColon => "expected `:` after an object key",
        E::ExpectedListCommaOrEnd => "expected `,` or `]` after an array element",
        E::ExpectedObjectCommaOrEnd => "expected `,` or `}` after an object member",
        E::ExpectedSomeIdent => "expected `true`, `false` or `null`",
        E::ExpectedSomeValue => "expected a JSON value",
        E::InvalidEscape => "a string has an invalid escape",
        E::InvalidNumber => "a number is malformed",
        E::NumberOutOfRange => return (Code::InexactNumber, INEXACT),
        E::ControlCharacterWhileParsingString => "a string holds an unescaped control character",
        E::KeyMustBeAString => "an object key must be a string",
        E::TrailingComma => "a trailing comma",
        E::TrailingCharacters => "there is more text after the JSON value",
        _ => "the text is not valid JSON",
    };
    (Code::InvalidJson, what)
}

/// Appends `token` escaped as a JSON Pointer reference token (RFC 6901: `~` and `/`).
pub fn escape_token(token: &str, out: &mut String) {
    for c in token.chars() {
        match c {
            '~' => out.push_str("~0"),
            '/' => out.push_str("~1"),
            c => out.push(c),
        }
    }
}

/// The nesting depth of `text` when it is deeper than `limit`, else `None`.
///
/// Runs before any parse, on text that may be broken. A text with no more opening brackets than
/// `limit` (strings included) cannot nest deeper, and one vectorized count proves it; any other
/// text is measured by [`nesting_depth`].
pub fn depth_over(text: &[u8], limit: usize) -> Option<usize> {
    if opening_brackets(text) <= limit {
        return None;
    }
    let depth = nesting_depth(text);
    (depth > limit).then_some(depth)
}

/// How many `[` and `{` the text holds, strings included. `[` and `{` are the only bytes that
/// are `{` once bit 5 is set; byte counters over blocks of 255 let the compiler vectorize.
fn opening_brackets(text: &[u8]) -> usize {
    text.chunks(255)
        .map(|block| {
            let count = block
                .iter()
                .fold(0u8, |count, &byte| count + u8::from(byte | 0x20 == b'{'));
            usize::from(count)
        })
        .sum()
}

/// The deepest nesting of brackets outside strings, in one pass. A backslash in a string escapes
/// the next byte; a string left open runs to the end of the text (its brackets are text); a
/// closing bracket with nothing open is ignored, so it cannot hide the depth that follows.
pub fn nesting_depth(text: &[u8]) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let mut at = 0;
    while let Some(&byte) = text.get(at) {
        at += 1;
        match byte {
            b'"' => at = string_end(text, at),
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// Just past the quote that closes the string whose contents start at `at` (or the end of the
/// text), eight bytes at a time: a word with no quote and no backslash is skipped whole.
fn string_end(text: &[u8], mut at: usize) -> usize {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    // the high bit of each byte of `word` equal to `byte`, exact up to the first such byte
    let find = |word: u64, byte: u8| {
        let x = word ^ (ONES * u64::from(byte));
        x.wrapping_sub(ONES) & !x & HIGHS
    };
    loop {
        while let Some(chunk) = text.get(at..at + 8) {
            let word = u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8]));
            let found = find(word, b'"') | find(word, b'\\');
            if found != 0 {
                at += (found.trailing_zeros() / 8) as usize;
                break;
            }
            at += 8;
        }
        match text.get(at) {
            None => return text.len(),
            Some(b'"') => return at + 1,
            Some(b'\\') => at += 2,
            Some(_) => at += 1,
        }
    }
}

/// Builds nothing, for [`check_value`]: all it keeps is each open object's keys, for the
/// duplicate check.
struct Checker;

impl Builder for Checker {
    type Value = ();
    type Key = String;
    type Array = ();
    type Object = HashSet<String>;
    type Error = std::convert::Infallible;

    fn null(&mut self) {}
    fn bool(&mut self, _value: bool) {}
    fn int(&mut self, _value: i64) {}
    fn uint(&mut self, _value: u64) {}
    fn float(&mut self, _value: f64) {}
    fn string(&mut self, _value: &str) {}
    fn key(&mut self, key: &str) -> String {
        key.to_owned()
    }
    fn array(&mut self) {}
    fn push(&mut self, _array: &mut (), _value: ()) {}
    fn end_array(&mut self, _array: ()) -> Result<(), Self::Error> {
        Ok(())
    }
    fn object(&mut self) -> HashSet<String> {
        HashSet::new()
    }
    fn insert(
        &mut self,
        keys: &mut HashSet<String>,
        key: &String,
        _value: (),
    ) -> Result<bool, Self::Error> {
        Ok(keys.insert(key.clone()))
    }
    fn end_object(&mut self, _keys: HashSet<String>) {}
    fn key_text(key: &String) -> Cow<'_, str> {
        Cow::Borrowed(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::{parse_value, Value};

    fn ok(text: &str) -> Value {
        parse_value(text.as_bytes(), 64).unwrap_or_else(|f| panic!("{text:?}: {f:?}"))
    }

    fn err(text: &[u8]) -> Failure {
        parse_value(text, 64).expect_err("must be rejected")
    }

    fn obj(members: &[(&str, Value)]) -> Value {
        Value::Object(
            members
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone()))
                .collect(),
        )
    }

    #[test]
    fn builds_every_kind_of_value() {
        assert_eq!(
            ok(r#" {"a": [1, -2.5, "x", true, false, null, {}, []]} "#),
            obj(&[(
                "a",
                Value::Array(vec![
                    Value::Int(1),
                    Value::Float(-2.5),
                    Value::Str("x".into()),
                    Value::Bool(true),
                    Value::Bool(false),
                    Value::Null,
                    Value::Object(vec![]),
                    Value::Array(vec![]),
                ])
            )])
        );
        assert_eq!(ok("0"), Value::Int(0));
        assert_eq!(ok("-0"), Value::Int(0));
        assert_eq!(ok("-0.0"), Value::Int(0));
        assert_eq!(ok("1E2"), Value::Int(100));
        assert_eq!(
            ok(r#""a\"\\\/\b\f\n\r\tz""#),
            Value::Str("a\"\\/\u{8}\u{c}\n\r\tz".into())
        );
    }

    #[test]
    fn integers_cover_both_64_bit_ranges_and_nothing_more() {
        assert_eq!(ok("-9223372036854775808"), Value::Int(i64::MIN.into()));
        assert_eq!(ok("9223372036854775808"), Value::Int(1 << 63));
        assert_eq!(ok("18446744073709551615"), Value::Int(u64::MAX.into()));
        for text in [
            "18446744073709551616",
            "-9223372036854775809",
            "123456789012345678901234",
        ] {
            let failure = err(text.as_bytes());
            assert_eq!(failure.code, Code::InexactNumber);
            assert!(failure.message.starts_with(INEXACT), "{failure:?}");
        }
        let long = "9".repeat(5000);
        assert_eq!(err(long.as_bytes()).code, Code::InexactNumber);
    }

    #[test]
    fn a_number_is_its_exact_value_in_every_spelling() {
        // integers, however spelt
        for text in [
            "10000",
            "1e4",
            "1E+4",
            "10000.0",
            "1.0e4",
            "100.00e2",
            "100000e-1",
        ] {
            assert_eq!(ok(text), Value::Int(10_000), "{text}");
        }
        assert_eq!(ok("1.8446744073709551615e19"), Value::Int(u64::MAX.into()));
        assert_eq!(ok("-9.223372036854775808E18"), Value::Int(i64::MIN.into()));
        // the shortest form of a double is that double
        for (text, double) in [
            ("0.1", 0.1),
            ("0.10", 0.1),
            ("1e-1", 0.1),
            ("-2.5", -2.5),
            ("5e-324", 5e-324),
            ("8796093022208.688", 8_796_093_022_208.688),
            ("8796093022208.062", 8_796_093_022_208.062),
        ] {
            assert_eq!(ok(text), Value::Float(double), "{text}");
        }
        // anything else would be judged as another value than the text passed on
        for text in [
            "0.99999999999999999",
            "99999999.99999999999",
            "1.00000000000000000001",
            "3e28",
            "3E+28",
            "1e300",
            "1.7976931348623157e308",
            "1e400",
            "-1e400",
            "[123.456e789]",
            "1e-400",
            "[123e-10000000]",
            "0.30000000000000001",
            // a tie of two 16-digit forms: the even one is the double's (Python's repr)
            "8796093022208.687",
            "8796093022208.063",
            "18446744073709551615.5",
        ] {
            let failure = err(text.as_bytes());
            assert_eq!(failure.code, Code::InexactNumber, "{text}");
        }
    }

    #[test]
    fn nan_and_infinity_are_non_finite() {
        for text in [
            "NaN",
            "Infinity",
            "-Infinity",
            "[1, NaN]",
            r#"{"n": -Infinity}"#,
        ] {
            assert_eq!(err(text.as_bytes()).code, Code::NonFiniteNumber, "{text}");
        }
        for text in ["-NaN", "nan", "Inf", "-Inf", "infinity"] {
            assert_eq!(err(text.as_bytes()).code, Code::InvalidJson, "{text}");
        }
        assert_eq!(err(b"[1, NaN]").path, "/1");
    }

    #[test]
    fn duplicate_keys_at_any_depth_name_the_second_occurrence() {
        let cases: [(&str, &str); 6] = [
            (r#"{"amount": 10, "amount": 100}"#, "/amount"),
            (r#"{"x": [0, {"b": 1, "b": 2}]}"#, "/x/1/b"),
            (r#"{"a": 1, "\u0061": 2}"#, "/a"),
            (r#"{"a/b": {"c~": 1, "c~": 1}}"#, "/a~1b/c~0"),
            (r#"[[], [{"k": {}, "k": []}]]"#, "/1/0/k"),
            (r#"{"": 1, "": 2}"#, "/"),
        ];
        for (text, path) in cases {
            let failure = err(text.as_bytes());
            assert_eq!(
                (failure.code, failure.path.as_str()),
                (Code::DuplicateKey, path),
                "{text}"
            );
        }
        // where: the second key's opening quote
        let failure = err(b"{\"a\": 1,\n  \"a\": 2}");
        assert!(
            failure.message.ends_with("(line 2, column 3)"),
            "{failure:?}"
        );
        // the same key in sibling objects is no duplicate
        ok(r#"[{"a": 1}, {"a": 2}, {"b": {"a": 3}, "a": 4}]"#);
    }

    #[test]
    fn surrogate_escapes_must_pair() {
        assert_eq!(ok(r#""\ud83d\ude00""#), Value::Str("\u{1F600}".into()));
        for text in [
            r#""\ud800""#,
            r#""\udc00x""#,
            r#"["\ud800\u0041"]"#,
            r#""\ud800\n""#,
            r#""\ude00\ud83d""#,
            r#"{"\udfff": 1}"#,
        ] {
            assert_eq!(err(text.as_bytes()).code, Code::InvalidUtf8, "{text}");
        }
        assert_eq!(err(br#"{"s": ["\udc00"]}"#).path, "/s/0");
    }

    #[test]
    fn text_that_is_not_utf8_is_invalid_utf8_wherever_it_is() {
        for text in [
            &b"\"\xff\""[..],
            b"[\"a\xc3\"]",
            b"\"\xed\xa0\x80\"",
            b"[1, \xff]",
            b"\xff",
            b"{\"a\": 1,}\xfe",
            b"[\"\x01\xff\"]",
        ] {
            assert_eq!(err(text).code, Code::InvalidUtf8, "{text:?}");
        }
        assert_eq!(err(b"{\"s\": \"\xff\"}").path, "/s");
        assert_eq!(
            ok("\"h\u{e9}\u{1F600}\""),
            Value::Str("h\u{e9}\u{1F600}".into())
        );
    }

    #[test]
    fn syntax_errors_are_invalid_json_with_a_place() {
        let cases: [(&[u8], &str, &str); 10] = [
            (b"", "the text is empty (line 1, column 0)", ""),
            (b" \n ", "the text is empty", ""),
            (
                b"\xEF\xBB\xBF{}",
                "the text starts with a byte-order mark",
                "",
            ),
            (
                b"[1 2]",
                "expected `,` or `]` after an array element (line 1, column 4)",
                "",
            ),
            (b"{\"a\": [1,]}", "a trailing comma", "/a"),
            (b"{\"a\" 1}", "expected `:` after an object key", ""),
            (
                b"{\"a\": 1} x",
                "there is more text after the JSON value",
                "",
            ),
            (
                b"[\"ab\ncd\"]",
                "a string holds an unescaped control character",
                "/0",
            ),
            (
                b"{\"a\": {\"b\": tru}}",
                "expected `true`, `false` or `null`",
                "/a/b",
            ),
            (b"[\"\\x\"]", "a string has an invalid escape", "/0"),
        ];
        for (text, message, path) in cases {
            let failure = err(text);
            assert_eq!(failure.code, Code::InvalidJson, "{text:?}");
            assert!(
                failure.message.starts_with(message),
                "{text:?}: {failure:?}"
            );
            assert_eq!(failure.path, path, "{text:?}");
        }
        assert!(err(b"{\n  \"a\": 1,\n  \"b\": }")
            .message
            .ends_with("(line 3, column 8)"));
    }

    #[test]
    fn messages_never_echo_the_text() {
        for text in [
            &br#"{"secret-key": NaN}"#[..],
            br#"{"secret-key": 1, "secret-key": 2}"#,
            br#"{"secret-key": "\ud800"}"#,
            br#"{"secret-key": secret}"#,
            b"\"secret-\xff\"",
        ] {
            assert!(!err(text).message.contains("secret"), "{text:?}");
        }
    }

    #[test]
    fn depth_is_limited_and_capped() {
        assert_eq!(
            parse_value(b"[[[]]]", 3),
            Ok(Value::Array(vec![Value::Array(vec![Value::Array(vec![])])]))
        );
        let failure = parse_value(b"[[[[]]]]", 3).expect_err("too deep");
        assert_eq!(
            (failure.code, failure.path.as_str()),
            (Code::TooDeep, "/0/0/0")
        );
        let failure = parse_value(br#"{"a": [{"b": {}}]}"#, 3).expect_err("too deep");
        assert_eq!(
            (failure.code, failure.path.as_str()),
            (Code::TooDeep, "/a/0/b")
        );
        assert_eq!(parse_value(b"7", 0), Ok(Value::Int(7)));
        assert_eq!(
            parse_value(b"[]", 0).expect_err("too deep").code,
            Code::TooDeep
        );
        // the cap holds whatever max_depth says, and a far deeper text costs no recursion
        let deep = format!("{}{}", "[".repeat(DEPTH_CAP + 1), "]".repeat(DEPTH_CAP + 1));
        assert_eq!(
            parse_value(deep.as_bytes(), usize::MAX)
                .expect_err("capped")
                .code,
            Code::TooDeep
        );
        let at_cap = format!("{}{}", "[".repeat(DEPTH_CAP), "]".repeat(DEPTH_CAP));
        assert_eq!(
            parse_value(at_cap.as_bytes(), usize::MAX).map(|v| v.depth()),
            Ok(DEPTH_CAP)
        );
        let huge = "[".repeat(1_000_000);
        assert_eq!(
            parse_value(huge.as_bytes(), usize::MAX)
                .expect_err("capped")
                .code,
            Code::TooDeep
        );
    }

    #[test]
    fn pointer_tokens_escape_tilde_then_slash() {
        let mut out = String::new();
        escape_token("a/b~c~1/", &mut out);
        assert_eq!(out, "a~1b~0c~01~1");
        let mut out = String::new();
        escape_token("", &mut out);
        assert_eq!(out, "");
    }

    #[test]
    fn nesting_depth_reads_strings_and_escapes() {
        let cases: [(&[u8], usize); 13] = [
            (b"", 0),
            (b"123", 0),
            (br#"{"a": [[{"b": "[[[[["}]]]}"#, 4),
            (br#"["\"[[[["]"#, 1),   // an escaped quote does not end the string
            (br#"["\\", [[]]]"#, 3), // an escaped backslash does not escape the quote
            (br#"["\\\"[[", []]"#, 2),
            (b"[[[[", 4),          // truncated text still has a depth
            (br#"[["abc[[[["#, 2), // a string left open runs to the end
            (br#"["\"#, 1),        // a backslash as the last byte
            (b"]]]][[", 2),        // stray closers hide nothing
            (b"[]]][[[", 3),
            (b"{[}]", 2),   // brackets are not matched by kind
            (b"\\[\\[", 2), // outside strings a backslash is just a byte
        ];
        for (text, depth) in cases {
            assert_eq!(
                nesting_depth(text),
                depth,
                "{:?}",
                String::from_utf8_lossy(text)
            );
        }
    }

    #[test]
    fn depth_over_answers_only_past_the_limit() {
        assert_eq!(depth_over(br#"{"a": 1}"#, 1), None);
        assert_eq!(depth_over(b"[[[]]]", 3), None);
        assert_eq!(depth_over(b"[[[[]]]]", 3), Some(4));
        assert_eq!(depth_over(br#"{"s": "[[[[[[[[[[{{{{{{{{{{"}"#, 2), None);
        assert_eq!(depth_over(b"[[],[],[],[],[]]", 2), None);
        assert_eq!(depth_over(b"[[[[", 3), Some(4));
        assert_eq!(depth_over(b"", 0), None);
        assert_eq!(depth_over(b"[", 0), Some(1));
    }

    /// `check_value` on the value of the member `"x"` of `text`, then the rest of the object.
    fn check_member(text: &str, max_depth: usize) -> Result<Option<String>, Failure> {
        let data = text.as_bytes();
        let mut jiter = Jiter::new(data);
        assert_eq!(jiter.next_object().expect("an object"), Some("x"));
        check_value(&mut jiter, data, max_depth)?;
        let next = jiter
            .next_key()
            .expect("the rest is JSON")
            .map(str::to_owned);
        Ok(next)
    }

    #[test]
    fn check_value_takes_one_value_and_leaves_the_rest() {
        for value in [
            r#"{"a": [1, {"b": "[}"}], "c": {}}"#,
            "18446744073709551615",
            r#""\ud83d\ude00""#,
            "[]",
            "-0.5e-3",
            "null",
        ] {
            let text = format!(r#"{{"x": {value} , "y": 1}}"#);
            assert_eq!(check_member(&text, 8), Ok(Some("y".to_owned())), "{text}");
        }
    }

    #[test]
    fn check_value_is_as_strict_as_parse() {
        let cases: [(&[u8], Code, &str); 10] = [
            (br#"{"a": {"b": 1, "b": 2}}"#, Code::DuplicateKey, "/a/b"),
            (
                br#"[0, {"k~/": 1, "k~/": 1}]"#,
                Code::DuplicateKey,
                "/1/k~0~1",
            ),
            (br#"{"s": "\udc00"}"#, Code::InvalidUtf8, "/s"),
            (b"[\"\xff\"]", Code::InvalidUtf8, "/0"),
            (b"99999999999999999999", Code::InexactNumber, ""),
            (b"[1e400]", Code::InexactNumber, "/0"),
            (b"[0.10000000000000001]", Code::InexactNumber, "/0"),
            (b"[NaN]", Code::NonFiniteNumber, "/0"),
            (br#"{"a": 1,}"#, Code::InvalidJson, ""),
            (b"[[[]]]", Code::TooDeep, "/0/0"),
        ];
        for (value, code, path) in cases {
            let mut text = br#"{"x": "#.to_vec();
            text.extend_from_slice(value);
            text.extend_from_slice(b"}");
            let mut jiter = Jiter::new(&text);
            jiter.next_object().expect("an object");
            let failure = check_value(&mut jiter, &text, 2).expect_err("must be refused");
            assert_eq!(
                (failure.code, failure.path.as_str()),
                (code, path),
                "{value:?}"
            );
            // located in the whole text
            assert!(failure.message.contains("(line 1, column "), "{failure:?}");
        }
        let failure = check_member("{\"x\": {\"a\": 1,\n \"a\": 2}}", 8).expect_err("duplicate");
        assert!(
            failure.message.ends_with("(line 2, column 2)"),
            "{failure:?}"
        );
    }
}
