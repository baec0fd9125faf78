//! The parsed value in pure Rust, [`Value`], and the [`ValueBuilder`] that makes it: what the
//! Rust tests and the fuzz checks parse into (Python gets its own objects from the face's builder).

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt::Write as _;

use crate::json::{parse, Builder, Failure, Stop};

/// A parsed value in Rust. Object members keep their order.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    /// every integer in [-2^63, 2^64-1]
    Int(i128),
    Float(f64),
    Str(String),
    Array(Vec<Value>),
    Object(Vec<(String, Value)>),
}

impl Value {
    /// Containers deep: 0 for a scalar, 1 for `[]`.
    pub fn depth(&self) -> usize {
        match self {
            Value::Array(items) => 1 + items.iter().map(Value::depth).max().unwrap_or(0),
            Value::Object(members) => 1 + members.iter().map(|(_, v)| v.depth()).max().unwrap_or(0),
            _ => 0,
        }
    }

    /// Compact JSON text that parses back to this value (a float as the shortest decimal the
    /// rule for numbers reads back as it, with an exponent).
    pub fn to_json(&self) -> String {
        let mut out = String::new();
        self.write_json(&mut out);
        out
    }

    fn write_json(&self, out: &mut String) {
        match self {
            Value::Null => out.push_str("null"),
            Value::Bool(value) => out.push_str(if *value { "true" } else { "false" }),
            Value::Int(value) => {
                let _ = write!(out, "{value}");
            }
            Value::Float(value) => match crate::json::shortest_text(*value) {
                Some(text) => out.push_str(&text),
                // never parsed: a float is never integral or infinite (the rule for numbers)
                None => {
                    let _ = write!(out, "{value:?}");
                }
            },
            Value::Str(value) => write_string(value, out),
            Value::Array(items) => {
                out.push('[');
                for (n, item) in items.iter().enumerate() {
                    if n > 0 {
                        out.push(',');
                    }
                    item.write_json(out);
                }
                out.push(']');
            }
            Value::Object(members) => {
                out.push('{');
                for (n, (key, value)) in members.iter().enumerate() {
                    if n > 0 {
                        out.push(',');
                    }
                    write_string(key, out);
                    out.push(':');
                    value.write_json(out);
                }
                out.push('}');
            }
        }
    }
}

fn write_string(value: &str, out: &mut String) {
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// An object being built in Rust: its members, and its keys for the duplicate check.
#[derive(Default)]
pub struct ObjectInProgress {
    members: Vec<(String, Value)>,
    keys: HashSet<String>,
}

/// Builds [`Value`]s.
#[derive(Default)]
pub struct ValueBuilder;

impl Builder for ValueBuilder {
    type Value = Value;
    type Key = String;
    type Array = Vec<Value>;
    type Object = ObjectInProgress;
    type Error = std::convert::Infallible;

    fn null(&mut self) -> Value {
        Value::Null
    }
    fn bool(&mut self, value: bool) -> Value {
        Value::Bool(value)
    }
    fn int(&mut self, value: i64) -> Value {
        Value::Int(value.into())
    }
    fn uint(&mut self, value: u64) -> Value {
        Value::Int(value.into())
    }
    fn float(&mut self, value: f64) -> Value {
        Value::Float(value)
    }
    fn string(&mut self, value: &str) -> Value {
        Value::Str(value.to_owned())
    }
    fn key(&mut self, key: &str) -> String {
        key.to_owned()
    }
    fn array(&mut self) -> Vec<Value> {
        Vec::new()
    }
    fn push(&mut self, array: &mut Vec<Value>, value: Value) {
        array.push(value);
    }
    fn end_array(&mut self, array: Vec<Value>) -> Result<Value, Self::Error> {
        Ok(Value::Array(array))
    }
    fn object(&mut self) -> ObjectInProgress {
        ObjectInProgress::default()
    }
    fn insert(
        &mut self,
        object: &mut ObjectInProgress,
        key: &String,
        value: Value,
    ) -> Result<bool, Self::Error> {
        if !object.keys.insert(key.clone()) {
            return Ok(false);
        }
        object.members.push((key.clone(), value));
        Ok(true)
    }
    fn end_object(&mut self, object: ObjectInProgress) -> Value {
        Value::Object(object.members)
    }
    fn key_text(key: &String) -> Cow<'_, str> {
        Cow::Borrowed(key)
    }
}

/// Parses `data` into a [`Value`].
pub fn parse_value(data: &[u8], max_depth: usize) -> Result<Value, Failure> {
    match parse(data, max_depth, &mut ValueBuilder) {
        Ok(value) => Ok(value),
        Err(Stop::Invalid(failure)) => Err(failure),
        Err(Stop::Build(never)) => match never {},
    }
}
