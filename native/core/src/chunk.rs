//! A chunk as an adapter makes it (the Python face's `Chunk`), checked when it is made and turned
//! into what the reassembler is fed.
//!
//! `kind` is a channel (`tool_call`, `text`, `refusal`, `error`, `mcp_result`), `end` (the
//! stream ended; `finish_reason` says how; with a `call_id`, that call alone ended unreleased:
//! the choice or candidate it belongs to finished so, [`Incomplete::after`]), `abort` (the adapter met an event it could not place:
//! the call `call_id` cannot be trusted) or `malformed` (the record is not what its format says:
//! `delta` says why, `error` names the code, `malformed_record` unless said otherwise).
//! `expected` on a final piece is the vendor's own final text of the whole call. A tool call's
//! first piece may state its origin (`call_kind`, `caller`, `double_encoded`: [`crate::origin`]).

use std::borrow::Cow;

use crate::assembler::{CallPiece, Channel, Finish, Incomplete, Piece, Trace};
use crate::origin::{self, CallKind, Origin};
use crate::record::MALFORMED_RECORD;

/// A chunk's fields, borrowed from whoever holds them.
#[derive(Clone, Copy, Debug)]
pub struct Chunk<'a> {
    pub stream_id: &'a str,
    pub kind: &'a str,
    pub call_id: Option<&'a str>,
    pub seq: Option<u32>,
    pub tool: Option<&'a str>,
    pub tool_version: Option<&'a str>,
    pub delta: &'a str,
    pub is_final: bool,
    pub finish_reason: Option<&'a str>,
    pub idempotency_key: Option<&'a str>,
    pub principal: Option<&'a str>,
    pub trace_id: Option<&'a str>,
    pub run_id: Option<&'a str>,
    pub step_id: Option<&'a str>,
    pub traceparent: Option<&'a str>,
    pub attempt: Option<u32>,
    pub expected: Option<&'a str>,
    pub error: Option<&'a str>,
    pub call_kind: Option<&'a str>,
    pub caller: Option<&'a str>,
    pub double_encoded: bool,
}

/// What a chunk is to the reassembler, once its identifiers passed their bound.
#[derive(Clone, Debug)]
pub enum Fed<'a> {
    Piece(Piece<'a>),
    /// `named`: the stream and call a `malformed` chunk names (its adapter could read them:
    /// the agent waiting for that call hears of it), each within the identifier bound.
    Malformed {
        code: String,
        detail: String,
        named: Option<(&'a str, &'a str)>,
    },
}

impl<'a> Chunk<'a> {
    /// Why this chunk cannot be made, if it cannot: an unknown kind, finish reason or call
    /// kind, a caller that is not a JSON object, or an origin on a chunk that is no tool call.
    pub fn check(&self) -> Result<(), String> {
        let kind = self.kind;
        let known = matches!(kind, "end" | "abort" | "malformed") || Channel::parse(kind).is_some();
        if !known {
            return Err(format!("unknown chunk kind {kind:?}"));
        }
        if let Some(reason) = self.finish_reason {
            if Finish::parse(reason).is_none() {
                return Err(format!("unknown finish reason {reason:?}"));
            }
        }
        if self.call_kind.is_some() || self.caller.is_some() || self.double_encoded {
            if kind != Channel::ToolCall.as_str() {
                return Err(format!(
                    "a {kind} chunk states no call kind, caller or habit"
                ));
            }
            if let Some(name) = self.call_kind {
                origin::call_kind(name)?;
            }
            if let Some(caller) = self.caller {
                origin::check_caller(caller)?;
            }
        }
        Ok(())
    }

    /// The origin the chunk states (None when it states nothing). The chunk passed `check`.
    fn origin(&self) -> Option<Box<Origin>> {
        let kind = self.call_kind.map_or(CallKind::Function, |name| {
            CallKind::parse(name).expect("checked at construction")
        });
        Origin::stated(kind, self.caller, self.double_encoded).map(Box::new)
    }

    /// The piece this chunk is, or why it is malformed (an identifier or its caller longer than
    /// `max_id_bytes`, or a `malformed` chunk). The chunk passed [`Chunk::check`].
    pub fn to_fed(&self, max_id_bytes: usize) -> Fed<'a> {
        let ids = [
            ("stream_id", Some(self.stream_id)),
            ("call_id", self.call_id),
            ("tool", self.tool),
            ("tool_version", self.tool_version),
            ("idempotency_key", self.idempotency_key),
            ("principal", self.principal),
            ("trace_id", self.trace_id),
            ("run_id", self.run_id),
            ("step_id", self.step_id),
            ("traceparent", self.traceparent),
            ("caller", self.caller),
        ];
        let malformed = self.kind == "malformed";
        for (name, value) in ids {
            // a malformed chunk's call id only names its rejection, when it fits (below)
            if malformed && name == "call_id" {
                continue;
            }
            if value.is_some_and(|v| v.len() > max_id_bytes) {
                return Fed::Malformed {
                    code: MALFORMED_RECORD.to_owned(),
                    detail: format!("{name} is longer than {max_id_bytes} bytes"),
                    named: None,
                };
            }
        }
        let stream_id = Cow::Borrowed(self.stream_id);
        let call_id = || match self.call_id {
            Some(id) => Cow::Borrowed(id),
            None => Cow::Owned(format!("{}:{}", self.stream_id, self.kind)),
        };
        let finish = self.finish_reason.and_then(Finish::parse);
        let piece = match (self.kind, self.call_id) {
            ("end", None) => Piece::End { stream_id, finish },
            ("end", Some(call)) => Piece::Abort {
                stream_id,
                call_id: Cow::Borrowed(call),
                reason: Incomplete::after(finish),
            },
            ("abort", _) => Piece::Abort {
                stream_id,
                call_id: call_id(),
                reason: Incomplete::StreamCorrupt,
            },
            ("malformed", _) => {
                let call = self
                    .call_id
                    .filter(|id| !id.is_empty() && id.len() <= max_id_bytes);
                return Fed::Malformed {
                    code: self.error.unwrap_or(MALFORMED_RECORD).to_owned(),
                    detail: self.delta.to_owned(),
                    named: call.map(|call| (self.stream_id, call)),
                };
            }
            (kind, _) => {
                let trace = Trace {
                    trace_id: self.trace_id.map(Into::into),
                    run_id: self.run_id.map(Into::into),
                    step_id: self.step_id.map(Into::into),
                    traceparent: self.traceparent.map(Into::into),
                    attempt: self.attempt,
                };
                Piece::Call(CallPiece {
                    stream_id,
                    call_id: call_id(),
                    channel: Channel::parse(kind).expect("checked at construction"),
                    seq: self.seq,
                    tool: self.tool.map(Cow::Borrowed),
                    tool_version: self.tool_version.map(Cow::Borrowed),
                    delta: Cow::Borrowed(self.delta),
                    is_final: self.is_final,
                    idempotency_key: self.idempotency_key.map(Cow::Borrowed),
                    principal: self.principal.map(Cow::Borrowed),
                    trace: (!trace.is_empty()).then(|| Box::new(trace)),
                    expected: self.expected.map(Cow::Borrowed),
                    // an adapter names the tool on a tool call's first piece only: what
                    // follows continues a call and never opens one
                    opens: self.tool.is_some() || kind != "tool_call",
                    origin: self.origin(),
                })
            }
        };
        Fed::Piece(piece)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk<'a>(kind: &'a str, stream_id: &'a str) -> Chunk<'a> {
        Chunk {
            stream_id,
            kind,
            call_id: None,
            seq: None,
            tool: None,
            tool_version: None,
            delta: "{}",
            is_final: false,
            finish_reason: None,
            idempotency_key: None,
            principal: None,
            trace_id: None,
            run_id: None,
            step_id: None,
            traceparent: None,
            attempt: None,
            expected: None,
            error: None,
            call_kind: None,
            caller: None,
            double_encoded: false,
        }
    }

    #[test]
    fn only_known_kinds_and_finish_reasons_make_a_chunk() {
        assert!(chunk("tool_call", "s").check().is_ok());
        let end = Chunk {
            finish_reason: Some("length"),
            ..chunk("end", "s")
        };
        assert!(end.check().is_ok());
        assert_eq!(
            chunk("toolcall", "s").check(),
            Err("unknown chunk kind \"toolcall\"".to_owned())
        );
        let done = Chunk {
            finish_reason: Some("done"),
            ..chunk("end", "s")
        };
        assert_eq!(
            done.check(),
            Err("unknown finish reason \"done\"".to_owned())
        );
    }

    #[test]
    fn an_end_naming_a_call_ends_that_call_alone_as_its_finish_says() {
        let stream_end = Chunk {
            finish_reason: Some("length"),
            ..chunk("end", "s")
        };
        let Fed::Piece(Piece::End { finish, .. }) = stream_end.to_fed(64) else {
            panic!("the stream's end");
        };
        assert_eq!(finish, Some(Finish::Length));
        for (reason, incomplete) in [
            (Some("length"), Incomplete::MaxTokens),
            (Some("content_filter"), Incomplete::ContentFilter),
            (Some("stop"), Incomplete::StreamEnded),
            (None, Incomplete::StreamEnded),
        ] {
            let call_end = Chunk {
                call_id: Some("c"),
                finish_reason: reason,
                ..chunk("end", "s")
            };
            let Fed::Piece(Piece::Abort {
                call_id, reason, ..
            }) = call_end.to_fed(64)
            else {
                panic!("one call's end");
            };
            assert_eq!((&*call_id, reason), ("c", incomplete));
        }
        let Fed::Piece(Piece::Abort { reason, .. }) = chunk("abort", "s").to_fed(64) else {
            panic!("an abort");
        };
        assert_eq!(reason, Incomplete::StreamCorrupt);
    }

    #[test]
    fn only_a_tool_call_states_an_origin_and_only_a_known_one() {
        let custom = Chunk {
            call_kind: Some("custom_tool_call"),
            caller: Some(r#"{"type":"program"}"#),
            ..chunk("tool_call", "s")
        };
        assert!(custom.check().is_ok());
        let Fed::Piece(Piece::Call(piece)) = custom.to_fed(64) else {
            panic!("a call piece");
        };
        let origin = piece.origin.expect("stated");
        assert_eq!(origin.kind, CallKind::Custom);
        assert_eq!(origin.caller.as_deref(), Some(r#"{"type":"program"}"#));
        let unknown = Chunk {
            call_kind: Some("computer_call"),
            ..chunk("tool_call", "s")
        };
        assert!(unknown.check().unwrap_err().contains("unknown call kind"));
        let text = Chunk {
            double_encoded: true,
            ..chunk("text", "s")
        };
        assert_eq!(
            text.check(),
            Err("a text chunk states no call kind, caller or habit".to_owned())
        );
        let list = Chunk {
            caller: Some("[]"),
            ..chunk("tool_call", "s")
        };
        assert!(list.check().is_err());
        let Fed::Piece(Piece::Call(plain)) = chunk("tool_call", "s").to_fed(64) else {
            panic!("a call piece");
        };
        assert!(plain.origin.is_none());
    }

    #[test]
    fn a_caller_past_the_identifier_bound_makes_the_chunk_malformed() {
        let long = Chunk {
            caller: Some(r#"{"type":"program"}"#),
            ..chunk("tool_call", "s")
        };
        let Fed::Malformed { detail, .. } = long.to_fed(8) else {
            panic!("malformed");
        };
        assert_eq!(detail, "caller is longer than 8 bytes");
    }

    #[test]
    fn an_identifier_past_its_bound_makes_the_chunk_malformed() {
        match chunk("tool_call", "stream").to_fed(5) {
            Fed::Malformed { code, detail, .. } => {
                assert_eq!(code, MALFORMED_RECORD);
                assert_eq!(detail, "stream_id is longer than 5 bytes");
            }
            Fed::Piece(piece) => panic!("{piece:?}"),
        }
    }

    #[test]
    fn a_continuation_opens_no_call_and_a_call_without_id_is_named_by_its_kind() {
        let Fed::Piece(Piece::Call(piece)) = chunk("tool_call", "s").to_fed(64) else {
            panic!("a call piece");
        };
        assert!(!piece.opens);
        assert_eq!(piece.call_id, "s:tool_call");
        let named = Chunk {
            tool: Some("t"),
            ..chunk("tool_call", "s")
        };
        let Fed::Piece(Piece::Call(piece)) = named.to_fed(64) else {
            panic!("a call piece");
        };
        assert!(piece.opens);
        let Fed::Piece(Piece::Call(text)) = chunk("text", "s").to_fed(64) else {
            panic!("a call piece");
        };
        assert!(text.opens);
    }

    #[test]
    fn a_malformed_chunk_names_its_code_or_the_default() {
        let Fed::Malformed { code, detail, .. } = chunk("malformed", "s").to_fed(64) else {
            panic!("malformed");
        };
        assert_eq!((code.as_str(), detail.as_str()), (MALFORMED_RECORD, "{}"));
        let named = Chunk {
            error: Some("unsupported_format"),
            ..chunk("malformed", "s")
        };
        let Fed::Malformed { code, .. } = named.to_fed(64) else {
            panic!("malformed");
        };
        assert_eq!(code, "unsupported_format");
    }

    #[test]
    fn a_malformed_chunk_names_its_call_when_the_id_fits_the_bound() {
        let named = Chunk {
            call_id: Some("call_1"),
            error: Some("unsupported_call_kind"),
            ..chunk("malformed", "s")
        };
        let Fed::Malformed { code, named, .. } = named.to_fed(64) else {
            panic!("malformed");
        };
        assert_eq!(
            (code.as_str(), named),
            ("unsupported_call_kind", Some(("s", "call_1")))
        );
        let long = Chunk {
            call_id: Some("call_1"),
            error: Some("unsupported_call_kind"),
            ..chunk("malformed", "s")
        };
        let Fed::Malformed { code, named, .. } = long.to_fed(5) else {
            panic!("malformed");
        };
        assert_eq!((code.as_str(), named), ("unsupported_call_kind", None));
    }
}
