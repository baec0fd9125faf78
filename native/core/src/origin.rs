//! What an adapter says of a call besides its text: the kind of call its vendor made, who made
//! it, and a habit of its server. Set on the piece that opens the call, carried by the
//! reassembler and its snapshots, written into the event; never read by the reassembler.
//!
//! - [`CallKind`]: what contract kind judges the call. A plain function call (the default: every
//!   format's tool call, an envelope's) takes JSON arguments; OpenAI Responses' other client-run
//!   calls each have a kind of their own (a custom tool's free-form text input, the built-in
//!   `apply_patch`, `shell`, `local_shell` tools, a remote MCP tool's approval request).
//! - `caller`: the vendor's object naming who made the call when the model did not make it
//!   itself (OpenAI's programmatic tool calling: `{"type": "program", "caller_id": ...}`),
//!   as JSON text; the event embeds it as it is.
//! - `double_encoded`: the call's server is known to send arguments double-encoded (a JSON
//!   string holding the JSON text); the gate may decode them once, as a recorded repair.

use serde::{Deserialize, Serialize};

use crate::json::DEPTH_CAP;
use crate::value::{parse_value, Value};

/// The kind of call a vendor made, named as OpenAI Responses names its output items.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CallKind {
    #[default]
    Function,
    Custom,
    ApplyPatch,
    Shell,
    LocalShell,
    McpApprovalRequest,
}

impl CallKind {
    pub const ALL: [CallKind; 6] = [
        CallKind::Function,
        CallKind::Custom,
        CallKind::ApplyPatch,
        CallKind::Shell,
        CallKind::LocalShell,
        CallKind::McpApprovalRequest,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            CallKind::Function => "function_call",
            CallKind::Custom => "custom_tool_call",
            CallKind::ApplyPatch => "apply_patch_call",
            CallKind::Shell => "shell_call",
            CallKind::LocalShell => "local_shell_call",
            CallKind::McpApprovalRequest => "mcp_approval_request",
        }
    }

    pub fn parse(name: &str) -> Option<CallKind> {
        CallKind::ALL.into_iter().find(|kind| kind.as_str() == name)
    }
}

/// A call's origin as its adapter stated it (see the module's docs).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Origin {
    pub kind: CallKind,
    pub caller: Option<Box<str>>,
    pub double_encoded: bool,
}

impl Origin {
    /// The origin these fields state, or None when they state nothing (a plain function call
    /// made by the model, from a server without the habit).
    pub fn stated(kind: CallKind, caller: Option<&str>, double_encoded: bool) -> Option<Origin> {
        let origin = Origin {
            kind,
            caller: caller.map(Box::from),
            double_encoded,
        };
        (origin != Origin::default()).then_some(origin)
    }
}

/// The call kind named `name`, or why there is none.
pub fn call_kind(name: &str) -> Result<CallKind, String> {
    CallKind::parse(name).ok_or_else(|| {
        let known: Vec<&str> = CallKind::ALL.iter().map(|kind| kind.as_str()).collect();
        format!("unknown call kind {name:?}; known: {}", known.join(", "))
    })
}

/// Why `caller` cannot be a call's caller, if it cannot: it must be one strict JSON object
/// (the event embeds the text as it is).
pub fn check_caller(caller: &str) -> Result<(), String> {
    match parse_value(caller.as_bytes(), DEPTH_CAP) {
        Ok(Value::Object(_)) => Ok(()),
        Ok(_) => Err("a caller must be a JSON object".to_owned()),
        Err(failure) => Err(format!(
            "a caller must be a JSON object: {}",
            failure.message
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_named_once_and_read_back() {
        for kind in CallKind::ALL {
            assert_eq!(CallKind::parse(kind.as_str()), Some(kind));
        }
        assert_eq!(CallKind::default().as_str(), "function_call");
        assert!(call_kind("computer_call")
            .unwrap_err()
            .starts_with("unknown call kind \"computer_call\"; known: function_call, "));
    }

    #[test]
    fn an_origin_that_states_nothing_is_none() {
        assert_eq!(Origin::stated(CallKind::Function, None, false), None);
        let custom = Origin::stated(CallKind::Custom, None, false).expect("stated");
        assert_eq!(custom.kind, CallKind::Custom);
        assert!(Origin::stated(CallKind::Function, Some("{}"), false).is_some());
        assert!(Origin::stated(CallKind::Function, None, true).is_some());
    }

    #[test]
    fn a_caller_is_one_strict_json_object() {
        assert_eq!(
            check_caller(r#"{"type":"program","caller_id":"c1"}"#),
            Ok(())
        );
        assert_eq!(
            check_caller("[]"),
            Err("a caller must be a JSON object".to_owned())
        );
        for bad in [r#"{"a":1,"a":2}"#, "{", r#"{"a":NaN}"#, "{} {}"] {
            assert!(check_caller(bad).is_err(), "{bad}");
        }
    }
}
