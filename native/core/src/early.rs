//! The early judge: decides, chunk by chunk, whether a call's arguments so far can still become
//! a value its contract accepts, and says why not as soon as they cannot.
//!
//! A contract's schema is compiled once, at load, into an [`EarlySchema`]: only the keywords
//! whose verdict on a prefix is certain (every continuation is rejected), the rest ignored.
//! Ignoring a keyword only makes the judge more lenient, so a prefix that some valid value
//! extends is never rejected; what the judge cannot decide is left to the final judgement.
//!
//! Decided early, each as soon as the text read proves it:
//! - `type`: a value whose first byte shows a kind the schema does not allow (an `integer`-only
//!   place also refuses a complete number with a fraction);
//! - `enum` / `const`: a value of a kind no member has, a string no member starts with (escapes
//!   decoded), a complete string that is no member;
//! - `maxLength`: a string past it, in code points as JSON Schema counts;
//! - `maxItems`: an array that starts one element more;
//! - `minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum`: a complete number outside;
//! - `additionalProperties: false` (with no `patternProperties`): a complete key the object does
//!   not declare;
//! - the arguments' root is not an object (`json_parse`), and text no JSON value starts with
//!   (the strict parser's own failure on the text read; a text that may open a markdown fence,
//!   the one repair the chain makes, is left alone).
//!
//! A key an object already holds (the strict parser's `duplicate_key`), like a number that
//! parser refuses, ends the judgement: the call is that parser's, whatever is read after it.
//! A contract's rules judge only the kinds of call it judges.
//!
//! Subschemas are followed through `properties`, `additionalProperties` and `items` (one schema
//! for every element), and through local `$ref`s (`#` and `#/...` pointers in a document with no
//! nested `$id`; in draft 7 a `$ref` replaces its siblings, in 2020-12 the siblings are kept and
//! the reference followed only when they decide nothing). Everything else (`pattern`,
//! `anyOf`/`oneOf`/`allOf`/`not`, conditionals, `multipleOf`, `format`, `required`, minimums of
//! length and count, `patternProperties`, `prefixItems`, unresolvable references) is the final
//! judgement's.
//!
//! The [`Judge`] keeps a small state per open call: the open containers (with the current key
//! and the hashes of the keys read, or index), the lexer's state, and for a string the enum
//! members it may still be (a range of the sorted members) and its length; each byte is read
//! once.

use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use crate::json::{self, Code, Failure, DEPTH_CAP};
use crate::origin::CallKind;
use crate::value::Value;

const NULL: u8 = 1;
const BOOL: u8 = 2;
const INT: u8 = 4;
const FRACTION: u8 = 8;
const STRING: u8 = 16;
const ARRAY: u8 = 32;
const OBJECT: u8 = 64;
const ANY_KIND: u8 = 127;
const NUMBER: u8 = INT | FRACTION;

/// The node that decides nothing.
const ANY: u32 = 0;

/// How many `$ref`s deep compiling follows before it gives up on a chain (cycles are shared).
const MAX_REF_DEPTH: usize = 64;

/// A number in a schema or an instance, as the judges compare it: integers exactly, the rest
/// as doubles (what the strict parser and the engines make of them).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Num {
    Int(i128),
    Float(f64),
}

impl Num {
    /// Exact comparison (None when a double is not finite).
    fn cmp(self, other: Num) -> Option<std::cmp::Ordering> {
        use std::cmp::Ordering;
        match (self, other) {
            (Num::Int(a), Num::Int(b)) => Some(a.cmp(&b)),
            (Num::Float(a), Num::Float(b)) => a.partial_cmp(&b),
            (Num::Int(a), Num::Float(b)) => int_float(a, b),
            (Num::Float(a), Num::Int(b)) => int_float(b, a).map(Ordering::reverse),
        }
    }
}

/// An integer against a double, exactly: a strict inequality between the integer's rounding and
/// the double holds for the integer too; equal roundings are settled as integers.
fn int_float(a: i128, b: f64) -> Option<std::cmp::Ordering> {
    if !b.is_finite() {
        return None;
    }
    let rounded = a as f64;
    match rounded.partial_cmp(&b)? {
        std::cmp::Ordering::Equal => Some(a.cmp(&(b as i128))),
        other => Some(other),
    }
}

/// A bound on numbers: its value and its text for the message.
#[derive(Clone, Debug, PartialEq)]
struct Bound {
    value: Num,
    param: Box<str>,
}

/// `enum` or `const`: the strings it holds, sorted, and the kinds of its other members.
#[derive(Clone, Debug, PartialEq)]
struct Members {
    keyword: &'static str,
    strings: Vec<Box<[u8]>>,
    /// kinds a value may have and still equal a member (Python's `True == 1` counted)
    kinds: u8,
    param: Box<str>,
}

#[derive(Clone, Debug, PartialEq)]
enum Additional {
    Open(u32),
    Closed,
}

/// One schema location's early rules.
#[derive(Clone, Debug, PartialEq)]
struct Node {
    kinds: u8,
    type_param: Option<Box<str>>,
    members: Option<Box<Members>>,
    max_length: Option<u64>,
    max_items: Option<u64>,
    items: u32,
    properties: Vec<(Box<[u8]>, u32)>,
    additional: Additional,
    bounds: Vec<(&'static str, Bound)>,
}

impl Node {
    fn any() -> Node {
        Node {
            kinds: ANY_KIND,
            type_param: None,
            members: None,
            max_length: None,
            max_items: None,
            items: ANY,
            properties: Vec::new(),
            additional: Additional::Open(ANY),
            bounds: Vec::new(),
        }
    }

    fn decides_nothing(&self) -> bool {
        *self == Node::any()
    }

    fn property(&self, key: &[u8]) -> Option<u32> {
        self.properties
            .binary_search_by(|(name, _)| (**name).cmp(key))
            .ok()
            .map(|at| self.properties[at].1)
    }
}

/// The draft a schema is read in (`$ref` beside other keywords differs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Draft {
    Draft7,
    Draft2020,
}

impl Draft {
    pub fn parse(name: &str) -> Option<Draft> {
        match name {
            "draft7" => Some(Draft::Draft7),
            "draft2020-12" => Some(Draft::Draft2020),
            _ => None,
        }
    }
}

/// One contract's early rules, compiled once at load.
#[derive(Debug, PartialEq)]
pub struct EarlySchema {
    nodes: Vec<Node>,
    root: u32,
    /// the kinds of call its contract judges (a call of another kind is rejected whole, as a
    /// kind the contract does not judge)
    judges: Vec<CallKind>,
}

impl EarlySchema {
    /// The rules of the schema `text` (JSON) read in `draft`, for the calls of the kinds
    /// `judges` (those its contract judges).
    pub fn compile(text: &[u8], draft: Draft, judges: &[CallKind]) -> Result<EarlySchema, String> {
        let document = crate::value::parse_value(text, DEPTH_CAP)
            .map_err(|failure| format!("the schema is not JSON: {}", failure.message))?;
        let mut compiler = Compiler {
            document: &document,
            draft,
            nodes: vec![Node::any()],
            refs: HashMap::new(),
            resolvable: !nested_id(&document, true),
        };
        let root = compiler.node(&document, 0);
        Ok(EarlySchema {
            nodes: compiler.nodes,
            root,
            judges: judges.to_vec(),
        })
    }

    /// Whether the rules decide anything at all.
    pub fn decides_anything(&self) -> bool {
        !self.nodes[self.root as usize].decides_nothing()
    }

    fn node(&self, at: u32) -> &Node {
        &self.nodes[at as usize]
    }
}

/// Whether some schema below the root names its own `$id` (references then resolve against
/// other bases, which this compiler does not follow).
fn nested_id(value: &Value, root: bool) -> bool {
    match value {
        Value::Object(members) => members.iter().any(|(key, child)| {
            (!root && key == "$id" && matches!(child, Value::Str(_))) || nested_id(child, false)
        }),
        Value::Array(items) => items.iter().any(|child| nested_id(child, false)),
        _ => false,
    }
}

struct Compiler<'d> {
    document: &'d Value,
    draft: Draft,
    nodes: Vec<Node>,
    refs: HashMap<String, u32>,
    resolvable: bool,
}

fn member<'v>(members: &'v [(String, Value)], name: &str) -> Option<&'v Value> {
    members.iter().find(|(key, _)| key == name).map(|(_, v)| v)
}

fn count(value: &Value) -> Option<u64> {
    match value {
        Value::Int(n) if *n >= 0 => u64::try_from(*n).ok(),
        Value::Float(f) if *f >= 0.0 && f.fract() == 0.0 && *f < 1e18 => Some(*f as u64),
        _ => None,
    }
}

fn number(value: &Value) -> Option<Num> {
    match value {
        Value::Int(n) => Some(Num::Int(*n)),
        Value::Float(f) if f.is_finite() => Some(Num::Float(*f)),
        _ => None,
    }
}

fn kind_of(name: &str) -> Option<u8> {
    Some(match name {
        "null" => NULL,
        "boolean" => BOOL,
        "integer" => INT,
        "number" => NUMBER,
        "string" => STRING,
        "array" => ARRAY,
        "object" => OBJECT,
        _ => return None,
    })
}

impl Compiler<'_> {
    fn push(&mut self, node: Node) -> u32 {
        if node.decides_nothing() {
            return ANY;
        }
        self.nodes.push(node);
        (self.nodes.len() - 1) as u32
    }

    fn node(&mut self, schema: &Value, depth: usize) -> u32 {
        let Value::Object(members) = schema else {
            return ANY; // `true`, and `false` (which the final judgement rejects in full)
        };
        if let Some(Value::Str(reference)) = member(members, "$ref") {
            if self.draft == Draft::Draft7 {
                return self.reference(reference, depth);
            }
            let own = self.own(members, depth);
            if own.decides_nothing() {
                return self.reference(reference, depth);
            }
            return self.push(own);
        }
        let own = self.own(members, depth);
        self.push(own)
    }

    fn reference(&mut self, reference: &str, depth: usize) -> u32 {
        if !self.resolvable || depth >= MAX_REF_DEPTH {
            return ANY;
        }
        if let Some(&known) = self.refs.get(reference) {
            return known;
        }
        let Some(target) = resolve(self.document, reference) else {
            return ANY;
        };
        // reserved before compiling, so a reference cycle ends at this entry
        self.nodes.push(Node::any());
        let at = (self.nodes.len() - 1) as u32;
        self.refs.insert(reference.to_owned(), at);
        let compiled = match target {
            Value::Object(members) => {
                if let (Draft::Draft7, Some(Value::Str(next))) =
                    (self.draft, member(members, "$ref"))
                {
                    let next = next.clone();
                    let to = self.reference(&next, depth + 1);
                    self.nodes[to as usize].clone()
                } else if let Some(Value::Str(next)) = member(members, "$ref") {
                    let own = self.own(members, depth + 1);
                    if own.decides_nothing() {
                        let next = next.clone();
                        let to = self.reference(&next, depth + 1);
                        self.nodes[to as usize].clone()
                    } else {
                        own
                    }
                } else {
                    self.own(members, depth + 1)
                }
            }
            _ => Node::any(),
        };
        self.nodes[at as usize] = compiled;
        at
    }

    /// The rules of one schema object's own keywords.
    fn own(&mut self, members: &[(String, Value)], depth: usize) -> Node {
        let mut node = Node::any();
        match member(members, "type") {
            Some(Value::Str(name)) => {
                if let Some(kind) = kind_of(name) {
                    node.kinds = kind;
                    node.type_param = Some(Value::Str(name.clone()).to_json().into());
                }
            }
            Some(list @ Value::Array(names)) => {
                let kinds: Option<Vec<u8>> = names
                    .iter()
                    .map(|name| match name {
                        Value::Str(name) => kind_of(name),
                        _ => None,
                    })
                    .collect();
                if let Some(kinds) = kinds.filter(|kinds| !kinds.is_empty()) {
                    node.kinds = kinds.into_iter().fold(0, |all, kind| all | kind);
                    node.type_param = Some(list.to_json().into());
                }
            }
            _ => {}
        }
        if let Some(Value::Array(options)) = member(members, "enum") {
            node.members = Some(Box::new(members_of(
                "enum",
                options,
                &Value::Array(options.clone()),
            )));
        } else if let Some(value) = member(members, "const") {
            node.members = Some(Box::new(members_of(
                "const",
                std::slice::from_ref(value),
                value,
            )));
        }
        node.max_length = member(members, "maxLength").and_then(count);
        node.max_items = member(members, "maxItems").and_then(count);
        if let Some(items @ (Value::Object(_) | Value::Bool(_))) = member(members, "items") {
            let tuple_before =
                self.draft == Draft::Draft2020 && member(members, "prefixItems").is_some();
            if !tuple_before {
                node.items = self.node(items, depth + 1);
            }
        }
        if let Some(Value::Object(properties)) = member(members, "properties") {
            let mut compiled: Vec<(Box<[u8]>, u32)> = Vec::with_capacity(properties.len());
            for (name, schema) in properties {
                let at = self.node(schema, depth + 1);
                compiled.push((name.as_bytes().into(), at));
            }
            compiled.sort_by(|a, b| a.0.cmp(&b.0));
            compiled.dedup_by(|a, b| a.0 == b.0);
            node.properties = compiled;
        }
        if member(members, "patternProperties").is_none() {
            match member(members, "additionalProperties") {
                Some(Value::Bool(false)) => node.additional = Additional::Closed,
                Some(schema @ Value::Object(_)) => {
                    node.additional = Additional::Open(self.node(schema, depth + 1))
                }
                _ => {}
            }
        }
        for keyword in ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"] {
            if let Some(value) = member(members, keyword) {
                if let Some(bound) = number(value) {
                    let param = value.to_json().into();
                    node.bounds.push((
                        keyword,
                        Bound {
                            value: bound,
                            param,
                        },
                    ));
                }
            }
        }
        node
    }
}

fn members_of(keyword: &'static str, options: &[Value], param: &Value) -> Members {
    let mut strings: Vec<Box<[u8]>> = Vec::new();
    let mut kinds = 0;
    for option in options {
        kinds |= match option {
            Value::Null => NULL,
            // Python's True == 1 == 1.0: a boolean and a number may equal each other
            Value::Bool(_) | Value::Int(_) | Value::Float(_) => BOOL | NUMBER,
            Value::Str(text) => {
                strings.push(text.as_bytes().into());
                STRING
            }
            Value::Array(_) => ARRAY,
            Value::Object(_) => OBJECT,
        };
    }
    strings.sort();
    strings.dedup();
    Members {
        keyword,
        strings,
        kinds,
        param: param.to_json().into(),
    }
}

/// The target of a local reference (`#`, `#/a/b`), if it is one.
fn resolve<'v>(document: &'v Value, reference: &str) -> Option<&'v Value> {
    let pointer = reference.strip_prefix('#')?;
    if pointer.is_empty() {
        return Some(document);
    }
    let pointer = pointer.strip_prefix('/')?;
    if pointer.contains('%') {
        return None;
    }
    let mut at = document;
    for token in pointer.split('/') {
        let token = token.replace("~1", "/").replace("~0", "~");
        at = match at {
            Value::Object(members) => member(members, &token)?,
            Value::Array(items) => items.get(token.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(at)
}

/// A tool's name and the version a call names (none: the version a call naming none gets).
type ToolVersion = (Box<str>, Option<Box<str>>);

/// The contracts' early rules by tool name and version, and the depth the chain allows.
#[derive(Debug, Default)]
pub struct EarlyRules {
    by_tool: HashMap<ToolVersion, Arc<EarlySchema>>,
    pub max_depth: usize,
}

impl EarlyRules {
    pub fn new(max_depth: usize) -> Self {
        EarlyRules {
            by_tool: HashMap::new(),
            max_depth: max_depth.min(DEPTH_CAP),
        }
    }

    /// The rules for calls naming `tool` and `version` (`None`: the version a call that names
    /// none gets).
    pub fn insert(&mut self, tool: &str, version: Option<&str>, schema: Arc<EarlySchema>) {
        if schema.decides_anything() {
            self.by_tool
                .insert((tool.into(), version.map(Box::from)), schema);
        }
    }

    pub fn len(&self) -> usize {
        self.by_tool.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_tool.is_empty()
    }

    /// Only the entries `other` has with equal rules (both contract sets decide alike).
    pub fn agreeing(&self, other: &EarlyRules) -> EarlyRules {
        let by_tool = self
            .by_tool
            .iter()
            .filter(|(key, schema)| other.by_tool.get(*key).is_some_and(|o| **o == ***schema))
            .map(|(key, schema)| (key.clone(), schema.clone()))
            .collect();
        EarlyRules {
            by_tool,
            max_depth: self.max_depth.min(other.max_depth),
        }
    }

    /// A judge for a call of `kind` to `tool` at `version`, if its contract judges that kind
    /// and decides anything early.
    pub fn judge(&self, tool: &str, version: Option<&str>, kind: CallKind) -> Option<Judge> {
        let key = (Box::from(tool), version.map(Box::from));
        let schema = self.by_tool.get(&key)?;
        if !schema.judges.contains(&kind) {
            return None;
        }
        Some(Judge::new(schema.clone(), self.max_depth))
    }
}

/// A place in the arguments: a member's key or an element's index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Token {
    Key(String),
    Index(u64),
}

/// Why the arguments can no longer be accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rejection {
    /// A schema keyword fails: at `path`, `keyword`, with its schema value (JSON) for the message.
    Schema {
        path: Vec<Token>,
        keyword: &'static str,
        param: Option<Box<str>>,
    },
    /// The root is a value but not an object.
    RootNotObject,
    /// No JSON value starts so: the strict parser's failure on the text read.
    Json(Failure),
}

/// The call's early verdict: why, and the offset of the record whose chunk decided it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub rejection: Rejection,
    pub offset: i64,
}

#[derive(Clone, Debug)]
enum Frame {
    Object {
        node: u32,
        key: Vec<u8>,
        /// the hashes of the keys read (a key twice is the strict parser's failure)
        seen: HashSet<u64>,
    },
    Array {
        node: u32,
        started: u64,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lex {
    /// Before the root value.
    Start,
    /// A value must come (after `:` or `,` in an array).
    Value,
    /// After `[`: a value or `]`.
    FirstElement,
    /// After `{`: a key or `}`.
    FirstKey,
    /// After `,` in an object: a key.
    Key,
    /// After a key: `:`.
    Colon,
    /// After a value in a container: `,` or the container's end.
    After,
    /// After the root value: whitespace only.
    End,
    Str,
    Num(NumAt),
    Literal {
        word: &'static [u8],
        at: u8,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NumAt {
    Minus,
    Zero,
    Int,
    Dot,
    Fraction,
    E,
    ESign,
    Exponent,
}

/// The string being read: its node, what it may still equal, how long it is.
#[derive(Clone, Debug, Default)]
struct Text {
    key: bool,
    node: u32,
    /// escape: 0 none, 1 after `\`, 2..=5 reading hex digits (the count + 1)
    escape: u8,
    hex: u16,
    /// a high surrogate waiting for its low half
    high: u16,
    chars: u64,
    /// decoded bytes so far, and the range of sorted enum strings that start with them
    len: usize,
    low: u32,
    high_end: u32,
}

/// The incremental judge of one call's arguments.
#[derive(Clone, Debug)]
pub struct Judge {
    schema: Arc<EarlySchema>,
    max_depth: usize,
    stack: Vec<Frame>,
    lex: Lex,
    /// the node of the next value
    next: u32,
    text: Text,
    number: Vec<u8>,
    /// bytes read so far
    read: usize,
    /// nothing more is decided (a fence may open, too deep, or an unusual spelling)
    off: bool,
}

impl Judge {
    pub fn new(schema: Arc<EarlySchema>, max_depth: usize) -> Judge {
        let root = schema.root;
        Judge {
            schema,
            max_depth,
            stack: Vec::new(),
            lex: Lex::Start,
            next: root,
            text: Text::default(),
            number: Vec::new(),
            read: 0,
            off: false,
        }
    }

    /// Whether the judge has stopped deciding (what is left is the final judgement's).
    pub fn is_off(&self) -> bool {
        self.off
    }

    /// Bytes of the arguments read so far.
    pub fn read(&self) -> usize {
        self.read
    }

    /// Read what `text` (the whole arguments so far) holds past what was read; the rejection
    /// when it proves one.
    pub fn feed(&mut self, text: &[u8]) -> Option<Rejection> {
        if self.off {
            return None;
        }
        let from = self.read.min(text.len());
        self.read = text.len();
        for (at, &byte) in text.iter().enumerate().skip(from) {
            match self.byte(byte) {
                Ok(()) => {}
                Err(Stop::Off) => {
                    self.off = true;
                    return None;
                }
                Err(Stop::Rejected(rejection)) => {
                    self.off = true;
                    return Some(rejection);
                }
                Err(Stop::NotJson) => {
                    self.off = true;
                    // the whole character the byte begins: cut inside it, the text read is no
                    // UTF-8, a failure the whole text does not have
                    let end = (at + utf8_width(byte)).min(text.len());
                    return json_failure(&text[..end], self.max_depth);
                }
            }
        }
        None
    }

    fn path(&self) -> Vec<Token> {
        self.stack
            .iter()
            .map(|frame| match frame {
                Frame::Object { key, .. } => Token::Key(String::from_utf8_lossy(key).into_owned()),
                Frame::Array { started, .. } => Token::Index(started.saturating_sub(1)),
            })
            .collect()
    }

    fn reject(&self, keyword: &'static str, param: Option<&str>) -> Stop {
        Stop::Rejected(Rejection::Schema {
            path: self.path(),
            keyword,
            param: param.map(Box::from),
        })
    }

    fn byte(&mut self, byte: u8) -> Result<(), Stop> {
        match self.lex {
            Lex::Str => self.string_byte(byte),
            Lex::Num(at) => self.number_byte(at, byte),
            Lex::Literal { word, at } => {
                if word.get(at as usize) != Some(&byte) {
                    return Err(Stop::NotJson);
                }
                if at as usize + 1 == word.len() {
                    self.value_done();
                } else {
                    self.lex = Lex::Literal { word, at: at + 1 };
                }
                Ok(())
            }
            _ if is_space(byte) => Ok(()),
            Lex::Start => match byte {
                // a markdown fence (the chain strips it) or whitespace only Python strips
                b'`' | b'\x0b' | b'\x0c' => Err(Stop::Off),
                _ => self.value_start(byte),
            },
            Lex::Value => self.value_start(byte),
            Lex::FirstElement if byte == b']' => self.close(false),
            Lex::FirstElement => self.element(byte),
            Lex::FirstKey if byte == b'}' => self.close(true),
            Lex::FirstKey | Lex::Key if byte == b'"' => {
                self.open_string(true, ANY);
                Ok(())
            }
            Lex::Colon if byte == b':' => {
                self.lex = Lex::Value;
                Ok(())
            }
            Lex::After => match (byte, self.stack.last()) {
                (b',', Some(Frame::Object { .. })) => {
                    self.lex = Lex::Key;
                    Ok(())
                }
                (b',', Some(Frame::Array { .. })) => {
                    self.lex = Lex::Value;
                    self.start_element()
                }
                (b'}', Some(Frame::Object { .. })) => self.close(true),
                (b']', Some(Frame::Array { .. })) => self.close(false),
                _ => Err(Stop::NotJson),
            },
            _ => Err(Stop::NotJson),
        }
    }

    fn element(&mut self, byte: u8) -> Result<(), Stop> {
        self.start_element()?;
        self.value_start(byte)
    }

    /// An array's next element begins: past `maxItems`?
    fn start_element(&mut self) -> Result<(), Stop> {
        let Some(Frame::Array { node, started }) = self.stack.last_mut() else {
            return Err(Stop::NotJson);
        };
        *started += 1;
        let (node, started) = (*node, *started);
        let rules = self.schema.node(node);
        self.next = rules.items;
        if rules.max_items.is_some_and(|max| started > max) {
            // the array's own place: the element is not part of the path
            let mut path = self.path();
            path.pop();
            return Err(Stop::Rejected(Rejection::Schema {
                path,
                keyword: "maxItems",
                param: rules.max_items.map(|max| max.to_string().into()),
            }));
        }
        Ok(())
    }

    fn value_start(&mut self, byte: u8) -> Result<(), Stop> {
        let kind = match byte {
            b'{' => OBJECT,
            b'[' => ARRAY,
            b'"' => STRING,
            b't' | b'f' => BOOL,
            b'n' => NULL,
            b'-' | b'0'..=b'9' => NUMBER,
            // `NaN` and `Infinity` are the strict parser's own kind of failure
            b'N' | b'I' => return Err(Stop::Off),
            _ => return Err(Stop::NotJson),
        };
        if self.stack.is_empty() && kind != OBJECT {
            return Err(Stop::Rejected(Rejection::RootNotObject));
        }
        // a container past the depth bound: the call is the bound's, whatever it opens
        if kind & (OBJECT | ARRAY) != 0 && self.stack.len() >= self.max_depth {
            return Err(Stop::Off);
        }
        let node = self.next;
        let rules = self.schema.node(node);
        if rules.kinds & kind == 0 {
            return Err(self.reject("type", rules.type_param.as_deref()));
        }
        if let Some(members) = &rules.members {
            if members.kinds & kind == 0 {
                return Err(self.reject(members.keyword, Some(&members.param)));
            }
        }
        match byte {
            b'{' | b'[' => {
                if byte == b'{' {
                    self.stack.push(Frame::Object {
                        node,
                        key: Vec::new(),
                        seen: HashSet::new(),
                    });
                    self.lex = Lex::FirstKey;
                } else {
                    self.stack.push(Frame::Array { node, started: 0 });
                    self.lex = Lex::FirstElement;
                }
            }
            b'"' => self.open_string(false, node),
            b't' => {
                self.lex = Lex::Literal {
                    word: b"true",
                    at: 1,
                }
            }
            b'f' => {
                self.lex = Lex::Literal {
                    word: b"false",
                    at: 1,
                }
            }
            b'n' => {
                self.lex = Lex::Literal {
                    word: b"null",
                    at: 1,
                }
            }
            _ => {
                self.number.clear();
                self.number.push(byte);
                self.lex = Lex::Num(match byte {
                    b'-' => NumAt::Minus,
                    b'0' => NumAt::Zero,
                    _ => NumAt::Int,
                });
            }
        }
        Ok(())
    }

    fn close(&mut self, object: bool) -> Result<(), Stop> {
        match (self.stack.pop(), object) {
            (Some(Frame::Object { .. }), true) | (Some(Frame::Array { .. }), false) => {
                self.value_done();
                Ok(())
            }
            _ => Err(Stop::NotJson),
        }
    }

    fn value_done(&mut self) {
        self.lex = if self.stack.is_empty() {
            Lex::End
        } else {
            Lex::After
        };
    }

    fn open_string(&mut self, key: bool, node: u32) {
        let strings = if key {
            0
        } else {
            self.schema
                .node(node)
                .members
                .as_ref()
                .map_or(0, |m| m.strings.len())
        };
        self.text = Text {
            key,
            node,
            high_end: strings as u32,
            ..Text::default()
        };
        if key {
            if let Some(Frame::Object { key, .. }) = self.stack.last_mut() {
                key.clear();
            }
        }
        self.lex = Lex::Str;
    }

    fn string_byte(&mut self, byte: u8) -> Result<(), Stop> {
        match self.text.escape {
            0 => match byte {
                b'"' => {
                    if self.text.high != 0 {
                        return Err(Stop::Off);
                    }
                    self.string_end()
                }
                b'\\' => {
                    self.text.escape = 1;
                    Ok(())
                }
                0..=0x1f => Err(Stop::NotJson),
                _ => {
                    if self.text.high != 0 {
                        return Err(Stop::Off); // a lone surrogate: the strict parser's to name
                    }
                    if byte & 0xc0 != 0x80 {
                        self.text.chars += 1;
                    }
                    self.decoded(byte)?;
                    self.check_length()
                }
            },
            1 => {
                let plain = match byte {
                    b'"' => b'"',
                    b'\\' => b'\\',
                    b'/' => b'/',
                    b'b' => 0x08,
                    b'f' => 0x0c,
                    b'n' => b'\n',
                    b'r' => b'\r',
                    b't' => b'\t',
                    b'u' => {
                        self.text.escape = 2;
                        self.text.hex = 0;
                        return Ok(());
                    }
                    _ => return Err(Stop::NotJson),
                };
                if self.text.high != 0 {
                    return Err(Stop::Off);
                }
                self.text.escape = 0;
                self.text.chars += 1;
                self.decoded(plain)?;
                self.check_length()
            }
            digits => {
                let value = match byte {
                    b'0'..=b'9' => byte - b'0',
                    b'a'..=b'f' => byte - b'a' + 10,
                    b'A'..=b'F' => byte - b'A' + 10,
                    _ => return Err(Stop::NotJson),
                };
                self.text.hex = (self.text.hex << 4) | u16::from(value);
                if digits < 5 {
                    self.text.escape = digits + 1;
                    return Ok(());
                }
                self.text.escape = 0;
                let unit = self.text.hex;
                let code = match (self.text.high, unit) {
                    (0, 0xd800..=0xdbff) => {
                        self.text.high = unit;
                        return Ok(());
                    }
                    (0, 0xdc00..=0xdfff) => return Err(Stop::Off),
                    (0, _) => u32::from(unit),
                    (high, 0xdc00..=0xdfff) => {
                        self.text.high = 0;
                        0x10000 + ((u32::from(high) - 0xd800) << 10) + (u32::from(unit) - 0xdc00)
                    }
                    _ => return Err(Stop::Off),
                };
                let Some(c) = char::from_u32(code) else {
                    return Err(Stop::Off);
                };
                self.text.chars += 1;
                let mut buffer = [0u8; 4];
                for &b in c.encode_utf8(&mut buffer).as_bytes() {
                    self.decoded(b)?;
                }
                self.check_length()
            }
        }
    }

    /// One decoded byte of the string: a key's, or narrowing the enum strings it may equal.
    fn decoded(&mut self, byte: u8) -> Result<(), Stop> {
        if self.text.key {
            if let Some(Frame::Object { key, .. }) = self.stack.last_mut() {
                key.push(byte);
            }
            return Ok(());
        }
        let Some(members) = &self.schema.node(self.text.node).members else {
            return Ok(());
        };
        let at = self.text.len;
        let range = &members.strings[self.text.low as usize..self.text.high_end as usize];
        let low = range.partition_point(|s| s.get(at).copied() < Some(byte));
        let high = range.partition_point(|s| s.get(at).copied() <= Some(byte));
        self.text.high_end = self.text.low + high as u32;
        self.text.low += low as u32;
        self.text.len += 1;
        if self.text.low == self.text.high_end {
            return Err(self.reject(members.keyword, Some(&members.param)));
        }
        Ok(())
    }

    fn check_length(&self) -> Result<(), Stop> {
        if self.text.key {
            return Ok(());
        }
        let rules = self.schema.node(self.text.node);
        match rules.max_length {
            Some(max) if self.text.chars > max => {
                Err(self.reject("maxLength", Some(&max.to_string())))
            }
            _ => Ok(()),
        }
    }

    fn string_end(&mut self) -> Result<(), Stop> {
        if self.text.key {
            self.lex = Lex::Colon;
            let Some(Frame::Object { key, seen, .. }) = self.stack.last_mut() else {
                return Err(Stop::NotJson);
            };
            let mut hasher = DefaultHasher::new();
            key.hash(&mut hasher);
            if !seen.insert(hasher.finish()) {
                // a key twice (or two keys of one hash): the strict parser refuses the text at
                // the twin whatever follows, so nothing read after it decides
                return Err(Stop::Off);
            }
            let Some(Frame::Object { node, key, .. }) = self.stack.last() else {
                return Err(Stop::NotJson);
            };
            let rules = self.schema.node(*node);
            self.next = match (rules.property(key), &rules.additional) {
                (Some(child), _) => child,
                (None, Additional::Open(child)) => *child,
                (None, Additional::Closed) => return Err(self.reject("additionalProperties", None)),
            };
            return Ok(());
        }
        if let Some(members) = &self.schema.node(self.text.node).members {
            let exact = members
                .strings
                .get(self.text.low as usize)
                .is_some_and(|s| s.len() == self.text.len && self.text.low < self.text.high_end);
            if !exact {
                return Err(self.reject(members.keyword, Some(&members.param)));
            }
        }
        self.value_done();
        Ok(())
    }

    fn number_byte(&mut self, at: NumAt, byte: u8) -> Result<(), Stop> {
        let next = match (at, byte) {
            (NumAt::Minus, b'0') => NumAt::Zero,
            (NumAt::Minus, b'1'..=b'9') => NumAt::Int,
            (NumAt::Minus, b'I') => return Err(Stop::Off), // -Infinity
            (NumAt::Int, b'0'..=b'9') => NumAt::Int,
            (NumAt::Zero | NumAt::Int, b'.') => NumAt::Dot,
            (NumAt::Dot | NumAt::Fraction, b'0'..=b'9') => NumAt::Fraction,
            (NumAt::Zero | NumAt::Int | NumAt::Fraction, b'e' | b'E') => NumAt::E,
            (NumAt::E, b'+' | b'-') => NumAt::ESign,
            (NumAt::E | NumAt::ESign | NumAt::Exponent, b'0'..=b'9') => NumAt::Exponent,
            (NumAt::Zero | NumAt::Int | NumAt::Fraction | NumAt::Exponent, _) => {
                // a byte that may not follow a value (`01`, `1.5.`, `2x`) is the strict
                // parser's failure, shown before the number is complete
                if !self.may_follow_a_value(byte) {
                    return Err(Stop::NotJson);
                }
                self.number_end()?;
                self.value_done();
                return self.byte(byte);
            }
            _ => return Err(Stop::NotJson),
        };
        self.number.push(byte);
        self.lex = Lex::Num(next);
        Ok(())
    }

    /// Whether `byte` may come right after a value in the open container.
    fn may_follow_a_value(&self, byte: u8) -> bool {
        match (byte, self.stack.last()) {
            (b',', Some(_)) => true,
            (b'}', Some(Frame::Object { .. })) | (b']', Some(Frame::Array { .. })) => true,
            _ => is_space(byte),
        }
    }

    /// A complete number: a fraction where only integers may be, a bound it is past. Its value
    /// is the one the strict parser takes (`json::exact_number`); a number that parser refuses
    /// (`inexact_number`) ends the early judgement, whatever its spelling: the call's verdict is
    /// that parser's, never one on the number's rounding or on anything read after it.
    fn number_end(&mut self) -> Result<(), Stop> {
        let rules = self.schema.node(self.next);
        let value = match json::exact_number(&self.number) {
            Some(json::Exact::Int(n)) => Num::Int(i128::from(n)),
            Some(json::Exact::Uint(n)) => Num::Int(i128::from(n)),
            Some(json::Exact::Float(f)) => Num::Float(f),
            // the strict parser refuses it, and the call with it: nothing read after it decides
            None => return Err(Stop::Off),
        };
        // a double the rule takes is never integral (an integral value is an integer)
        if matches!(value, Num::Float(_)) && rules.kinds & FRACTION == 0 {
            return Err(self.reject("type", rules.type_param.as_deref()));
        }
        for (keyword, bound) in &rules.bounds {
            let Some(order) = value.cmp(bound.value) else {
                continue;
            };
            let fails = match *keyword {
                "minimum" => order.is_lt(),
                "maximum" => order.is_gt(),
                "exclusiveMinimum" => order.is_le(),
                "exclusiveMaximum" => order.is_ge(),
                _ => false,
            };
            if fails {
                return Err(self.reject(keyword, Some(&bound.param)));
            }
        }
        Ok(())
    }
}

enum Stop {
    Off,
    NotJson,
    Rejected(Rejection),
}

fn is_space(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | b'\r')
}

/// How many bytes the UTF-8 character that `lead` begins has.
fn utf8_width(lead: u8) -> usize {
    match lead {
        0xf0..=0xff => 4,
        0xe0..=0xef => 3,
        0xc0..=0xdf => 2,
        _ => 1,
    }
}

/// The strict parser's failure on the text read, when it is one no more text can mend (a text
/// it finds merely unfinished, or too deep, is left to the final judgement).
fn json_failure(read: &[u8], max_depth: usize) -> Option<Rejection> {
    match crate::value::parse_value(read, max_depth) {
        Err(failure)
            if failure.code != Code::TooDeep && !failure.message.starts_with(json::UNFINISHED) =>
        {
            Some(Rejection::Json(failure))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn judge(schema: &str) -> Judge {
        let compiled =
            EarlySchema::compile(schema.as_bytes(), Draft::Draft2020, &[]).expect("a schema");
        Judge::new(Arc::new(compiled), 64)
    }

    /// The first prefix length (fed byte by byte) with a rejection, and the rejection.
    fn first(schema: &str, text: &str) -> Option<(usize, Rejection)> {
        let mut judge = judge(schema);
        let bytes = text.as_bytes();
        (1..=bytes.len()).find_map(|end| judge.feed(&bytes[..end]).map(|r| (end, r)))
    }

    fn schema_at(found: Option<(usize, Rejection)>) -> Option<(usize, String, &'static str)> {
        match found? {
            (end, Rejection::Schema { path, keyword, .. }) => {
                let path = path
                    .iter()
                    .map(|t| match t {
                        Token::Key(k) => format!("/{k}"),
                        Token::Index(i) => format!("/{i}"),
                    })
                    .collect();
                Some((end, path, keyword))
            }
            _ => None,
        }
    }

    const WEATHER: &str = r#"{"type":"object","additionalProperties":false,
        "properties":{"city":{"type":"string","maxLength":5},
        "unit":{"enum":["celsius","fahrenheit"]},"days":{"type":"integer","minimum":1,"maximum":7},
        "tags":{"type":"array","maxItems":2,"items":{"const":"x"}}}}"#;

    #[test]
    fn each_keyword_decides_at_the_byte_that_proves_it() {
        let at = |text: &str| schema_at(first(WEATHER, text));
        assert_eq!(at(r#"{"city":"Paris"}"#), None);
        assert_eq!(
            at(r#"{"city":"Berlin"}"#),
            Some((15, "/city".into(), "maxLength"))
        );
        assert_eq!(
            at(r#"{"city":"\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9"}"#).map(|f| f.2),
            Some("maxLength")
        );
        assert_eq!(
            at(r#"{"city":"\ud83d\ude00\ud83d\ude00\ud83d\ude00\ud83d\ude00\ud83d\ude00"}"#),
            None
        );
        assert_eq!(at(r#"{"city":3}"#), Some((9, "/city".into(), "type")));
        assert_eq!(
            at(r#"{"unit":"kelvin"}"#),
            Some((10, "/unit".into(), "enum"))
        );
        assert_eq!(at(r#"{"unit":"c\u0065lsius"}"#), None);
        assert_eq!(at(r#"{"unit":"cels"}"#), Some((14, "/unit".into(), "enum")));
        assert_eq!(at(r#"{"unit":true}"#).map(|f| f.2), Some("enum"));
        assert_eq!(at(r#"{"days":8}"#), Some((10, "/days".into(), "maximum")));
        assert_eq!(at(r#"{"days":7.0}"#), None);
        assert_eq!(at(r#"{"days":2.5}"#), Some((12, "/days".into(), "type")));
        assert_eq!(at(r#"{"days":0}"#).map(|f| f.2), Some("minimum"));
        assert_eq!(
            at(r#"{"tags":["x","x","x"]}"#),
            Some((17, "/tags".into(), "maxItems"))
        );
        assert_eq!(
            at(r#"{"tags":["x","y"]}"#),
            Some((15, "/tags/1".into(), "const"))
        );
        assert_eq!(
            at(r#"{"cityx":1}"#),
            Some((8, "/cityx".into(), "additionalProperties"))
        );
        assert_eq!(at(r#"{"ci\u0074y":"a"}"#), None);
    }

    #[test]
    fn the_root_must_be_an_object_and_broken_json_is_the_strict_parsers_failure() {
        assert_eq!(first(WEATHER, "[1]"), Some((1, Rejection::RootNotObject)));
        match first(WEATHER, r#"{"city" "x"}"#) {
            Some((9, Rejection::Json(failure))) => {
                assert_eq!(failure.code, Code::InvalidJson);
                assert!(failure.message.starts_with("expected `:`"), "{failure:?}");
            }
            other => panic!("{other:?}"),
        }
        // a fence may open (the chain strips it), NaN is the strict parser's own failure
        assert_eq!(first(WEATHER, "```json\n{\"city\":1}"), None);
        assert_eq!(first(WEATHER, r#"{"days":NaN}"#), None);
        assert_eq!(first(WEATHER, r#"{"days":-Infinity}"#), None);
    }

    #[test]
    fn the_strict_parser_names_a_number_spelt_wrong_and_a_wide_character_whole() {
        // `01`: the `1` may not follow the number 0, which is never judged against `minimum`;
        // a call's text grows by whole characters (its chunks are text)
        for text in [
            r#"{"days":01}"#,
            r#"{"days":0{"#,
            r#"{"days":1.5."#,
            r#"{"city":é}"#,
        ] {
            let mut judge = judge(WEATHER);
            let mut ends = text.char_indices().map(|(at, c)| at + c.len_utf8());
            match ends.find_map(|end| judge.feed(&text.as_bytes()[..end])) {
                Some(Rejection::Json(failure)) => {
                    assert_eq!(failure.code, Code::InvalidJson, "{text}: {failure:?}")
                }
                other => panic!("{text}: {other:?}"),
            }
        }
    }

    #[test]
    fn nothing_decides_from_the_first_bracket_past_the_depth_bound() {
        let compiled = EarlySchema::compile(WEATHER.as_bytes(), Draft::Draft2020, &[]);
        let mut judge = Judge::new(Arc::new(compiled.expect("a schema")), 1);
        assert_eq!(judge.feed(br#"{"city":["#), None);
        assert!(judge.is_off());
    }

    #[test]
    fn a_key_twice_leaves_the_call_and_all_after_it_to_the_strict_parser() {
        let twice = r#"{"unit":"celsius","unit":"kelvin"}"#;
        assert_eq!(first(WEATHER, twice), None);
        let escaped = r#"{"city":"a","c\u0069ty":"b","town":1}"#;
        assert_eq!(first(WEATHER, escaped), None);
        // what is read before the twin still decides
        let before = schema_at(first(WEATHER, r#"{"town":1,"town":2}"#));
        assert_eq!(before, Some((7, "/town".into(), "additionalProperties")));
    }

    #[test]
    fn draft7_refs_replace_their_siblings_and_2020_refs_are_followed_when_siblings_say_nothing() {
        let schema = r##"{"$defs":{"short":{"type":"string","maxLength":1}},
            "properties":{"a":{"$ref":"#/$defs/short"},"b":{"$ref":"#/$defs/short","maxLength":3}}}"##;
        assert_eq!(
            schema_at(first(schema, r#"{"a":"xy"}"#)).map(|f| f.2),
            Some("maxLength")
        );
        assert_eq!(schema_at(first(schema, r#"{"b":"xy"}"#)), None);
        let recursive =
            r##"{"type":"object","properties":{"next":{"$ref":"#"},"n":{"type":"integer"}}}"##;
        assert_eq!(
            schema_at(first(recursive, r#"{"next":{"next":{"n":"x"}}}"#)).map(|f| f.1),
            Some("/next/next/n".into())
        );
        let id = r##"{"$defs":{"x":{"$id":"other","type":"string"}},"properties":{"a":{"$ref":"#/$defs/x"}}}"##;
        assert_eq!(first(id, r#"{"a":1}"#), None);
    }

    #[test]
    fn numbers_compare_exactly_against_their_bounds() {
        let schema =
            r#"{"properties":{"n":{"exclusiveMaximum":9007199254740992},"f":{"maximum":0.1}}}"#;
        assert_eq!(schema_at(first(schema, r#"{"n":9007199254740991}"#)), None);
        assert_eq!(
            schema_at(first(schema, r#"{"n":9007199254740992}"#)).map(|f| f.2),
            Some("exclusiveMaximum")
        );
        assert_eq!(schema_at(first(schema, r#"{"f":0.1}"#)), None);
        assert_eq!(
            schema_at(first(schema, r#"{"f":0.10000000000000001}"#)),
            None
        );
        assert_eq!(
            schema_at(first(schema, r#"{"f":0.2}"#)).map(|f| f.2),
            Some("maximum")
        );
    }

    #[test]
    fn a_number_the_strict_parser_refuses_is_left_to_it_in_every_spelling() {
        // 3 x 10^28 and numbers a double rounds: past the bounds by their roundings, but the
        // strict parser refuses them (inexact_number), however they are spelt
        let schema = r#"{"additionalProperties":false,
            "properties":{"n":{"type":"integer","minimum":1,"maximum":100000000},
            "r":{"exclusiveMinimum":0,"maximum":1}}}"#;
        for refused in [
            r#"{"n":3e28,"#,
            r#"{"n":3.0E+28,"#,
            r#"{"n":30000000000000000000000000000.000,"#,
            r#"{"n":300000000000000000000000000000e-1,"#,
            r#"{"n":0.50000000000000000001,"#,
            r#"{"n":1e300,"#,
            r#"{"r":1e-400,"#,
            r#"{"r":1.0000000000000000000001,"#,
            r#"{"n":18446744073709551616,"undeclared":1}"#,
            r#"{"r":1e-400,"undeclared":1}"#,
        ] {
            assert_eq!(first(schema, refused).map(|f| f.0), None, "{refused}");
        }
        for (taken, keyword) in [
            (r#"{"n":1.5e8,"#, "maximum"),
            (r#"{"n":0.5,"#, "type"),
            (r#"{"n":1e9,"#, "maximum"),
            (r#"{"r":0e5,"#, "exclusiveMinimum"),
            (r#"{"r":10e-1,"#, ""),
        ] {
            let found = schema_at(first(schema, taken)).map(|f| f.2).unwrap_or("");
            assert_eq!(found, keyword, "{taken}");
        }
    }
}
