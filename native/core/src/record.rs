//! A record that cannot be read becomes a call of its own, rejected `malformed_record` (or the
//! code its adapter names): its stream and call are the ones it names when they could be read
//! (an envelope's `stream_id` and `call_id`, so the agent waiting for that call hears of it),
//! else its stream is the record's key (cut to the identifier bound) and its call id names the
//! record's place; its event id names the record's place and which of the record's rejections it
//! is, its first, second, ... (no other event has it: [`record_event_id`]), and its detail is cut
//! to the detail bound. An envelope that cannot be read ends every call it could
//! belong to ([`abort_unreadable`]): without a stream it names or a key, every envelope call of
//! its partition.

use std::borrow::Cow;

use crate::assembler::{Closed, PartitionFeed, Scope};
use crate::envelope::Malformed;
use crate::event::record_event_id;

/// The code of a record that is not what its format says.
pub const MALFORMED_RECORD: &str = "malformed_record";

/// The call a record that could not be read becomes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordCall {
    pub stream_id: String,
    pub call_id: String,
    pub event_id: String,
    pub detail: String,
}

/// The `nth` call (from 0) the unreadable record at `offset` of `scope` makes (`at`: offset and
/// nth), with key `key`, naming the stream and call it could be read to name (`named`, each
/// within `max_id_bytes`).
pub fn record_call(
    scope: &Scope,
    at: (i64, u32),
    key: Option<&[u8]>,
    named: (Option<&str>, Option<&str>),
    detail: &str,
    max_id_bytes: usize,
    max_detail_bytes: usize,
) -> RecordCall {
    let (offset, nth) = at;
    let stream = match named.0 {
        Some(stream) => Cow::Borrowed(stream),
        None => String::from_utf8_lossy(key.unwrap_or_default()),
    };
    RecordCall {
        stream_id: cut(&stream, max_id_bytes).to_owned(),
        call_id: match named.1 {
            Some(call) if named.0.is_some() => cut(call, max_id_bytes).to_owned(),
            _ => format!("record:{}:{}:{}", scope.0, scope.1, offset),
        },
        event_id: record_event_id(&scope.0, scope.1, offset, nth),
        detail: cut(detail, max_detail_bytes).to_owned(),
    }
}

/// Ends, `stream_corrupt`, every call the unreadable envelope `bad` at `offset` could belong to:
/// the call it names (open, or not yet: then its later pieces are never taken as a call of their
/// own; see `PartitionFeed::break_call`), else every call of the stream it names, else of the
/// stream its record's key names, else (no stream can be read, no key names one: garbage, a
/// tombstone, `check`'s input, a producer that sets no key) every call of every envelope stream
/// of the partition. A stream it names that is a vendor stream it leaves alone: an envelope is
/// none of its pieces (`PartitionFeed::other_source`). The calls it closes go to `closed`.
pub fn abort_unreadable(
    feed: &mut PartitionFeed<'_>,
    offset: i64,
    key: Option<&[u8]>,
    bad: Malformed,
    closed: &mut Vec<Closed>,
) {
    match (bad.stream_id, bad.call_id) {
        (Some(stream), _) if feed.other_source(&stream, true) => {}
        (Some(stream), Some(call)) => feed.break_call(offset, &stream, &call, closed),
        (Some(stream), None) => feed.abort_stream(offset, &stream, closed),
        (None, _) => match key.and_then(|k| std::str::from_utf8(k).ok()) {
            Some(stream) if !stream.is_empty() => feed.abort_stream(offset, stream, closed),
            _ => feed.abort_envelope_streams(offset, closed),
        },
    }
}

/// At most `max_bytes` of `text`, cut at a character boundary.
fn cut(text: &str, max_bytes: usize) -> &str {
    if text.len() <= max_bytes {
        return text;
    }
    let mut end = max_bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn identifiers_and_detail_are_cut_at_a_character_boundary() {
        let scope = (Arc::from("in"), 3);
        let call = record_call(
            &scope,
            (7, 0),
            Some("aé".as_bytes()),
            (None, None),
            "déjà",
            2,
            3,
        );
        assert_eq!(call.stream_id, "a");
        assert_eq!(call.detail, "d\u{e9}");
        assert_eq!(call.call_id, "record:in:3:7");
        assert_eq!(call.event_id, record_event_id("in", 3, 7, 0));
        assert_eq!(call.event_id.len(), 32);
    }

    #[test]
    fn a_key_that_is_not_utf8_is_read_lossily() {
        let call = record_call(
            &(Arc::from("t"), 0),
            (0, 0),
            Some(b"\xffk"),
            (None, None),
            "",
            64,
            64,
        );
        assert_eq!(call.stream_id, "\u{fffd}k");
        let none = record_call(&(Arc::from("t"), 0), (0, 0), None, (None, None), "", 64, 64);
        assert_eq!(none.stream_id, "");
    }

    #[test]
    fn a_record_is_named_by_the_stream_and_call_it_names() {
        let scope = (Arc::from("t"), 0);
        let named = record_call(
            &scope,
            (5, 0),
            Some(b"k"),
            (Some("s"), Some("c")),
            "",
            64,
            64,
        );
        assert_eq!((&*named.stream_id, &*named.call_id), ("s", "c"));
        assert_eq!(named.event_id, record_event_id("t", 0, 5, 0));
        // the record's second rejection, naming another call: another event, another id
        let second = record_call(
            &scope,
            (5, 1),
            Some(b"k"),
            (Some("s"), Some("d")),
            "",
            64,
            64,
        );
        assert_ne!(second.event_id, named.event_id);
        let stream_only = record_call(&scope, (5, 0), Some(b"k"), (Some("s"), None), "", 64, 64);
        assert_eq!(
            (&*stream_only.stream_id, &*stream_only.call_id),
            ("s", "record:t:0:5")
        );
    }
}
