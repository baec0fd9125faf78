//! The serialized form of one partition's reassembly state: a base, then deltas.
//!
//! A *base* holds the whole state: the open calls with their text, the streams in activity order
//! (each with its calls in opening order), the recently closed calls, the partition's time and
//! the offset after the last record fed. A *delta* holds what changed since the previous base or
//! delta: the calls removed, the closed calls remembered, every call touched with only the text
//! appended since (or, when a bound dropped the text, the cut), the streams gone, the streams
//! changed in place and the streams that became active (in activity order). Applying a base and
//! then its deltas in order rebuilds the state exactly, activity order included, so a restored
//! partition decides what the original would have decided.
//!
//! Format: the 4 bytes `CGA8` (callgate assembler, version 8: a call's key says whether it is
//! an MCP result, held apart from the calls; version 7: a closed call remembers its
//! stream's source, envelopes or a vendor's; version 6: a stream says whether its calls
//! came in envelopes; version 5: a call past its bound holds the
//! hash of each piece, written whole with it, and a closed call remembers a hash of every piece
//! it took and whether a bound closed it before its end; version 4 whether it was rejected
//! early, version 3 added a call's principal, version 2 its origin),
//! then one postcard-encoded [`Frame`]. A new version gets a new tag; an unknown tag is refused,
//! never guessed at (a frame of another version of callgate is named as such).

use std::collections::HashMap;
use std::sync::Arc;

use hashlink::LinkedHashMap;
use serde::{Deserialize, Serialize};

use crate::assembler::{
    Assembler, Body, CallKey, Calls, Channel, ClosedCall, Labels, OpenCall, Overflow, Partition,
    Scope, Stream, Tools, Trace,
};
use crate::origin::Origin;

const TAG: &[u8; 4] = b"CGA8";
/// The tags of the versions before this one.
const OLDER: [&[u8; 4]; 7] = [
    b"CGA1", b"CGA2", b"CGA3", b"CGA4", b"CGA5", b"CGA6", b"CGA7",
];

#[derive(Serialize, Deserialize)]
enum Frame {
    Base {
        clock: i64,
        next_offset: i64,
        calls: Vec<(CallKey, CallState)>,
        streams: Vec<StreamState>,
        closed: Vec<(CallKey, ClosedCall)>,
    },
    Delta {
        clock: i64,
        next_offset: i64,
        removed: Vec<CallKey>,
        closed: Vec<(CallKey, ClosedCall)>,
        calls: Vec<(CallKey, CallState)>,
        removed_streams: Vec<Arc<str>>,
        changed_streams: Vec<StreamState>,
        moved_streams: Vec<StreamState>,
    },
}

/// A stream as written: its id, when it was last active, its open calls in opening order.
#[derive(Serialize, Deserialize)]
struct StreamState {
    id: Arc<str>,
    last_seen: i64,
    calls: Vec<Arc<str>>,
    envelope: bool,
}

impl StreamState {
    fn of(id: &Arc<str>, stream: &Stream) -> Self {
        StreamState {
            id: id.clone(),
            last_seen: stream.last_seen,
            calls: stream.calls.ids().cloned().collect(),
            envelope: stream.envelope,
        }
    }
}

/// One open call as written: all of its fields, and its text from `text_from` on.
#[derive(Serialize, Deserialize)]
struct CallState {
    channel: Channel,
    tool: Option<Box<str>>,
    tool_version: Option<Box<str>>,
    idempotency_key: Option<Box<str>>,
    principal: Option<Box<str>>,
    trace: Option<Box<Trace>>,
    origin: Option<Box<Origin>>,
    first_offset: i64,
    last_offset: i64,
    first_seen: i64,
    chunks: u32,
    next_seq: u32,
    duplicates: u32,
    received: u64,
    overflow: Option<Overflow>,
    reused: bool,
    text_from: u32,
    text: Vec<u8>,
    bounds_from: u32,
    bounds: Vec<u32>,
    /// Past a bound: the hash of every piece taken (whole).
    hashes: Vec<u64>,
}

impl CallState {
    /// The call, with its text and piece bounds from the given positions on.
    fn of(call: &OpenCall, text_from: usize, bounds_from: usize) -> Self {
        CallState {
            channel: call.channel,
            tool: call.tool_name().map(Box::from),
            tool_version: call.tool_version().map(Box::from),
            idempotency_key: call.idempotency_key().map(Box::from),
            principal: call.principal().map(Box::from),
            trace: call.trace().cloned().map(Box::new),
            origin: call.origin().cloned().map(Box::new),
            first_offset: call.first_offset,
            last_offset: call.last_offset,
            first_seen: call.first_seen,
            chunks: call.chunks,
            next_seq: call.next_seq,
            duplicates: call.duplicates,
            received: call.body.received(),
            overflow: call.body.overflow(),
            reused: call.reused,
            text_from: text_from as u32,
            text: call.body.text()[text_from..].to_vec(),
            bounds_from: bounds_from as u32,
            bounds: call.bounds().skip(bounds_from).collect(),
            hashes: call.body.dropped_hashes().to_vec(),
        }
    }

    /// Apply onto the call as restored so far (`None`: the call is new here).
    fn apply(self, previous: Option<OpenCall>, tools: &mut Tools) -> Result<OpenCall, String> {
        let (mut text, mut bounds) = match &previous {
            Some(call) => (call.body.text().to_vec(), call.bounds().collect()),
            None => (Vec::new(), Vec::new()),
        };
        if self.text_from as usize > text.len() || self.bounds_from as usize > bounds.len() {
            return Err("a delta continues text that the snapshot does not hold".to_owned());
        }
        text.truncate(self.text_from as usize);
        text.extend_from_slice(&self.text);
        bounds.truncate(self.bounds_from as usize);
        bounds.extend_from_slice(&self.bounds);
        let body = match self.overflow {
            Some(overflow) if self.hashes.len() <= self.chunks as usize => Body::Dropped {
                overflow,
                received: self.received,
                hashes: self.hashes.into_iter().collect(),
            },
            Some(_) => return Err("a call holds more piece hashes than pieces".to_owned()),
            None if self.received == text.len() as u64
                && bounds.len() == self.chunks as usize
                && bounds.windows(2).all(|pair| pair[0] <= pair[1])
                && bounds
                    .last()
                    .map_or(text.is_empty(), |&end| end as usize == text.len()) =>
            {
                let ends = bounds[..bounds.len().saturating_sub(1)].iter().copied();
                Body::Text {
                    text,
                    ends: ends.collect(),
                }
            }
            None => return Err("a call's text, its pieces and its size disagree".to_owned()),
        };
        let labels = (self.idempotency_key.is_some()
            || self.principal.is_some()
            || self.trace.is_some()
            || self.origin.is_some())
        .then(|| {
            Box::new(Labels {
                idempotency_key: self.idempotency_key,
                principal: self.principal,
                trace: self.trace,
                origin: self.origin,
            })
        });
        let mut call = OpenCall {
            channel: self.channel,
            reused: self.reused,
            // as after a write: the next delta writes it (and its text from here on)
            dirty: true,
            tool: tools.intern(self.tool, self.tool_version),
            labels,
            written: body.text().len() as u32,
            written_bounds: 0,
            body,
            first_offset: self.first_offset,
            last_offset: self.last_offset,
            first_seen: self.first_seen,
            chunks: self.chunks,
            next_seq: self.next_seq,
            duplicates: self.duplicates,
            busy_ns: 0,
            // looked up again, and its text read again, when its next piece comes
            judge: None,
            judged: false,
        };
        call.written_bounds = call.pieces() as u32;
        Ok(call)
    }
}

fn encode(frame: &Frame) -> Vec<u8> {
    let mut bytes = TAG.to_vec();
    postcard::to_io(frame, &mut bytes).expect("a Vec<u8> always takes the bytes");
    bytes
}

fn decode(bytes: &[u8]) -> Result<Frame, String> {
    let body = bytes.strip_prefix(TAG).ok_or_else(|| {
        let tag = bytes.get(..4).unwrap_or(bytes);
        if OLDER.iter().any(|older| tag == &older[..]) {
            format!(
                "a snapshot written by an older callgate ({}); this one reads {}",
                String::from_utf8_lossy(tag),
                String::from_utf8_lossy(TAG)
            )
        } else {
            "not a callgate assembler snapshot (or an unknown version)".to_owned()
        }
    })?;
    postcard::from_bytes(body).map_err(|e| format!("a snapshot frame cannot be read: {e}"))
}

/// Mark everything in the partition as written; the next delta starts from here.
fn mark_written(part: &mut Partition) {
    for stream in part.streams.values_mut() {
        stream.moved = false;
        stream.changed = false;
        for call in stream.calls.values_mut() {
            call.written = call.body.text().len() as u32;
            call.written_bounds = call.pieces() as u32;
            call.dirty = false;
        }
    }
    part.removed.clear();
    part.newly_closed.clear();
    part.removed_streams.clear();
    part.tracking = true;
}

pub fn write_base(assembler: &mut Assembler, scope: &Scope) -> Vec<u8> {
    let part = assembler.partitions.entry(scope.clone()).or_default();
    let frame = Frame::Base {
        clock: part.clock,
        next_offset: part.next_offset,
        calls: part
            .calls()
            .map(|(stream, id, call)| (key(stream, id), CallState::of(call, 0, 0)))
            .collect(),
        streams: part
            .streams
            .iter()
            .map(|(id, stream)| StreamState::of(id, stream))
            .collect(),
        closed: part
            .closed
            .iter()
            .map(|(k, c)| (k.clone(), c.clone()))
            .collect(),
    };
    mark_written(part);
    encode(&frame)
}

pub fn write_delta(assembler: &mut Assembler, scope: &Scope) -> Vec<u8> {
    let part = assembler.partitions.entry(scope.clone()).or_default();
    let calls = part
        .calls()
        .filter(|(_, _, call)| call.dirty)
        .map(|(stream, id, call)| {
            // a bound that dropped the text shows as text shorter than what was written
            let text_from = (call.written as usize).min(call.body.text().len());
            let bounds_from = (call.written_bounds as usize).min(call.pieces());
            (key(stream, id), CallState::of(call, text_from, bounds_from))
        })
        .collect();
    let mut last_close: HashMap<&CallKey, usize> = HashMap::new();
    for (index, key) in part.newly_closed.iter().enumerate() {
        last_close.insert(key, index);
    }
    let mut closed: Vec<(usize, CallKey, ClosedCall)> = last_close
        .into_iter()
        .filter_map(|(key, index)| {
            part.closed
                .get(key)
                .map(|c| (index, key.clone(), c.clone()))
        })
        .collect();
    closed.sort_by_key(|(index, _, _)| *index);
    // streams that became active since the last write are at the back, in activity order;
    // a stream only changed in place (a call of it closed) keeps its place
    let mut changed_streams = Vec::new();
    let mut moved_streams = Vec::new();
    for (id, stream) in part.streams.iter() {
        if stream.moved {
            moved_streams.push(StreamState::of(id, stream));
        } else if stream.changed {
            changed_streams.push(StreamState::of(id, stream));
        }
    }
    let frame = Frame::Delta {
        clock: part.clock,
        next_offset: part.next_offset,
        removed: part.removed.clone(),
        closed: closed.into_iter().map(|(_, k, c)| (k, c)).collect(),
        calls,
        removed_streams: part.removed_streams.clone(),
        changed_streams,
        moved_streams,
    };
    mark_written(part);
    encode(&frame)
}

pub fn restore(assembler: &mut Assembler, scope: &Scope, frames: &[Vec<u8>]) -> Result<(), String> {
    let mut frames = frames.iter();
    let first = frames.next().ok_or("no snapshot to restore from")?;
    let Frame::Base {
        clock,
        next_offset,
        calls,
        streams,
        closed,
    } = decode(first)?
    else {
        return Err("a restore starts from a base snapshot, not a delta".to_owned());
    };
    let bound = assembler.limits.recently_closed;
    let mut part = Partition {
        clock,
        next_offset,
        ..Partition::default()
    };
    // calls and streams apart until the last frame, then each call into its stream
    let mut open: HashMap<CallKey, OpenCall> = HashMap::new();
    let mut order: LinkedHashMap<Arc<str>, StreamState> = LinkedHashMap::new();
    for (key, state) in calls {
        let call = state.apply(None, &mut part.tools)?;
        open.insert(key, call);
    }
    for state in streams {
        order.insert(state.id.clone(), state);
    }
    for (key, entry) in closed {
        remember(&mut part, key, entry, bound);
    }
    for bytes in frames {
        let Frame::Delta {
            clock,
            next_offset,
            removed,
            closed,
            calls,
            removed_streams,
            changed_streams,
            moved_streams,
        } = decode(bytes)?
        else {
            return Err("a base snapshot after the first frame".to_owned());
        };
        for key in removed {
            open.remove(&key);
        }
        for (key, entry) in closed {
            remember(&mut part, key, entry, bound);
        }
        for (key, state) in calls {
            let previous = open.remove(&key);
            let call = state.apply(previous, &mut part.tools)?;
            open.insert(key, call);
        }
        for id in removed_streams {
            order.remove(&id);
        }
        for state in changed_streams {
            match order.get_mut(&state.id) {
                Some(place) => *place = state,
                None => return Err("a delta changes a stream the snapshot does not hold".into()),
            }
        }
        for state in moved_streams {
            order.remove(&state.id);
            order.insert(state.id.clone(), state);
        }
        part.clock = clock;
        part.next_offset = next_offset;
    }
    for (id, state) in order {
        let mut calls: Option<Calls> = None;
        for call_id in state.calls {
            let call = open
                .remove(&key(&id, &call_id))
                .ok_or("a stream names a call the snapshot does not hold")?;
            match &mut calls {
                None => calls = Some(Calls::One(call_id, call)),
                Some(calls) => calls.push(call_id, call),
            }
            part.open += 1;
        }
        let calls = calls.ok_or("a stream without calls")?;
        let stream = Stream {
            calls,
            last_seen: state.last_seen,
            moved: true,
            changed: false,
            envelope: state.envelope,
        };
        part.streams.insert(id, stream);
    }
    if !open.is_empty() {
        return Err("the snapshot's streams and calls disagree".to_owned());
    }
    part.tracking = true;
    assembler.drop_partition(scope);
    assembler.adopt(scope.clone(), part);
    Ok(())
}

fn key(stream: &Arc<str>, call: &Arc<str>) -> CallKey {
    CallKey {
        stream_id: stream.clone(),
        call_id: call.clone(),
        result: false,
    }
}

fn remember(part: &mut Partition, key: CallKey, entry: ClosedCall, bound: usize) {
    part.closed.insert(key, entry, bound);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::assembler::{CallPiece, Closed, Limits, Piece};
    use crate::origin::CallKind;

    fn limits() -> Limits {
        Limits {
            max_call_bytes: 64,
            max_call_chunks: 8,
            max_open_calls: 4,
            idle_timeout_ms: 1_000,
            max_call_lifetime_ms: 10_000,
            recently_closed: 3,
        }
    }

    fn piece(
        stream: &str,
        call: &str,
        seq: Option<u32>,
        delta: &str,
        last: bool,
    ) -> Piece<'static> {
        Piece::Call(CallPiece {
            stream_id: stream.to_owned().into(),
            call_id: call.to_owned().into(),
            channel: Channel::ToolCall,
            seq,
            tool: (seq == Some(0)).then(|| "t".into()),
            tool_version: None,
            idempotency_key: None,
            // stream c's calls name a principal, which a restore must keep
            principal: (seq == Some(0) && stream == "c").then(|| format!("p-{call}").into()),
            trace: None,
            delta: delta.to_owned().into(),
            is_final: last,
            expected: None,
            opens: true,
            // stream c's calls state an origin, which a restore must keep
            origin: (seq == Some(0) && stream == "c").then(|| {
                Box::new(Origin {
                    kind: CallKind::Custom,
                    caller: Some(format!(r#"{{"caller_id":"{call}"}}"#).into()),
                    double_encoded: call == "y",
                })
            }),
        })
    }

    /// The calls each record closes, as (stream, call, ending, text) lines.
    fn run(assembler: &mut Assembler, scope: &Scope, records: &[(i64, Piece<'_>)]) -> Vec<String> {
        let mut lines = Vec::new();
        for (offset, piece) in records {
            let mut out: Vec<Closed> = Vec::new();
            assert!(assembler.begin_record(scope, *offset, Some(*offset * 100), &mut out));
            assembler
                .feed(scope, *offset, piece.clone(), &mut out)
                .expect("a vendor stream's piece");
            lines.extend(out.into_iter().map(|c| {
                format!(
                    "{}/{} {:?} {} {} {:?}",
                    c.stream_id,
                    c.call_id,
                    c.ending,
                    String::from_utf8_lossy(&c.text),
                    c.first_offset,
                    c.origin,
                )
            }));
        }
        lines
    }

    fn workload() -> Vec<(i64, Piece<'static>)> {
        let mut records = Vec::new();
        let mut offset = 0;
        for round in 0..6u32 {
            for stream in ["a", "b", "c"] {
                for call in ["x", "y"] {
                    let last = round % 3 == 2;
                    let seq = round % 3;
                    let text = format!("{stream}{call}{round};");
                    let text = if round == 4 && stream == "b" {
                        "z".repeat(70)
                    } else {
                        text
                    };
                    records.push((offset, piece(stream, call, Some(seq), &text, last)));
                    offset += 1;
                }
            }
        }
        // copies of the pieces of stream b's calls, past their bound (70 bytes) and closed: one
        // equal (a retransmission), one that differs (a reuse of its id)
        records.push((offset, piece("b", "x", Some(1), &"z".repeat(70), false)));
        records.push((offset + 1, piece("b", "y", Some(1), "zz", false)));
        offset += 2;
        // a reuse, a retransmission, a late tail and an end
        records.push((offset, piece("a", "x", Some(0), "again", false)));
        records.push((offset + 1, piece("c", "y", Some(1), "cy4;", false)));
        records.push((
            offset + 2,
            Piece::End {
                stream_id: "a".into(),
                finish: None,
            },
        ));
        records
    }

    /// Cut the workload anywhere, snapshot (base, or base plus deltas), restore into a new
    /// assembler: the rest of the input closes the same calls the same way.
    #[test]
    fn restoring_at_any_point_decides_as_the_original() {
        let records = workload();
        let scope: Scope = (Arc::from("t"), 0);
        let mut original = Assembler::new(limits());
        let expected = run(&mut original, &scope, &records);
        for cut in 0..records.len() {
            for deltas_every in [0usize, 1, 3] {
                let mut live = Assembler::new(limits());
                let mut frames = vec![write_base(&mut live, &scope)];
                let mut lines = Vec::new();
                for (i, record) in records[..cut].iter().enumerate() {
                    lines.extend(run(&mut live, &scope, std::slice::from_ref(record)));
                    if deltas_every > 0 && i % deltas_every == 0 {
                        frames.push(write_delta(&mut live, &scope));
                    }
                }
                if deltas_every == 0 {
                    frames = vec![write_base(&mut live, &scope)];
                } else {
                    frames.push(write_delta(&mut live, &scope));
                }
                let mut restored = Assembler::new(limits());
                restore(&mut restored, &scope, &frames).expect("restores");
                assert_eq!(restored.open_calls(), live.open_calls(), "cut {cut}");
                assert_eq!(
                    restored.buffered_bytes(),
                    live.buffered_bytes(),
                    "cut {cut}"
                );
                lines.extend(run(&mut restored, &scope, &records[cut..]));
                assert_eq!(
                    lines, expected,
                    "cut at {cut}, a delta every {deltas_every}"
                );
            }
        }
    }

    #[test]
    fn unknown_versions_and_a_delta_first_are_refused() {
        let scope: Scope = (Arc::from("t"), 0);
        let mut assembler = Assembler::new(limits());
        assert!(restore(&mut assembler, &scope, &[b"CGA9".to_vec()]).is_err());
        let older = restore(&mut assembler, &scope, &[b"CGA1\x00".to_vec()]);
        assert_eq!(
            older.unwrap_err(),
            "a snapshot written by an older callgate (CGA1); this one reads CGA8"
        );
        // version 4 held no hashes of a call past its bound (nor all of a closed call's), version
        // 5 no stream's kind, version 6 no closed call's source, version 7 no key's slot (a
        // result's or a call's): a frame of any is refused, named, never read as this version's
        let mut live = Assembler::new(limits());
        run(&mut live, &scope, &workload());
        let mut frame = write_base(&mut live, &scope);
        assert!(restore(&mut assembler, &scope, &[frame.clone()]).is_ok());
        for older in [b"CGA4", b"CGA5", b"CGA6", b"CGA7"] {
            frame[..4].copy_from_slice(older);
            assert_eq!(
                restore(&mut assembler, &scope, &[frame.clone()]).unwrap_err(),
                format!(
                    "a snapshot written by an older callgate ({}); this one reads CGA8",
                    String::from_utf8_lossy(older)
                )
            );
        }
        let delta = write_delta(&mut assembler, &scope);
        assert!(restore(&mut assembler, &scope, &[delta]).is_err());
    }
}
