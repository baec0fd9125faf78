//! The reassembler: ordered pieces of many interleaved streams in, complete calls out.
//!
//! Pure Rust, no Python: `lib.rs` is its face. It is fed one partition's records in offset
//! order; each record brings zero or more [`Piece`]s (a canonical envelope is one piece, a vendor
//! event as many as its adapter made). It returns the calls those pieces closed, complete or not.
//!
//! Every decision is a function of the record sequence alone, never of how the records were
//! batched or of a wall clock, so a partition restored from a snapshot and fed the records after
//! it closes exactly the calls, with exactly the verdict inputs, that it closed the first time:
//!
//! - Time is the partition's own: the largest record timestamp seen (`clock`). A stream is active
//!   whenever a record of it arrives (any vendor event, even one that yields no piece). Before each
//!   record, every stream idle for `idle_timeout_ms` of that time has its open calls closed
//!   `timeout`; a call whose next piece arrives `max_call_lifetime_ms` after its first is closed
//!   `max_lifetime`. A stalled or paused partition does not age.
//! - `seq` numbers a call's pieces from 0. A repeat is a retransmission, dropped and counted, but
//!   only when it equals the piece already taken (else the call is `stream_corrupt`); a jump is a
//!   `sequence_gap`. Pieces without `seq` are taken in record order.
//! - A call ends complete with `final` (when the adapter sent the vendor's final text as
//!   `expected`, it must equal the assembled text, else `stream_corrupt`), or incomplete: its
//!   stream's end while open (`max_tokens`, `content_filter`, `stream_ended`), an `Abort` from
//!   its adapter (`stream_corrupt`), a piece that contradicts the call (another channel, tool,
//!   version or key: `stream_corrupt`), eviction (`evicted`: the oldest call of the least recently
//!   active stream, when the partition holds `max_open_calls`), the timers above.
//! - A piece that cannot open a call (an adapter's continuation) for a call that is neither open
//!   nor remembered belongs to a call already judged and forgotten: dropped, counted.
//! - Past `max_call_bytes` or `max_call_chunks` the text is dropped and the call, when it ends,
//!   is rejected `too_large` / `too_many_chunks`.
//! - A closed call is remembered (`recently_closed` per partition, oldest forgotten first) with a
//!   hash of each of its first pieces. A later piece under its id is a retransmission when it
//!   equals a piece of that call (dropped, counted), a late piece of a call that ended incomplete
//!   (dropped, counted: that call has its verdict), or else a new call reusing the id: it is
//!   assembled as its own call, which is always rejected `call_id_reused`.
//!
//! The state of a partition can be written out whole ([`Assembler::snapshot`]) or as what
//! changed since the last write ([`Assembler::delta`]) and rebuilt from a snapshot and the deltas
//! after it ([`Assembler::restore`]); the serialized form lives in `snapshot.rs`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use hashlink::{LinkedHashMap, LinkedHashSet};
use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64;

/// Pieces of a closed call whose hashes are kept to tell retransmissions from reuse.
const HASHED_PIECES: usize = 64;

/// The bounds of the reassembler; every value comes from the settings.
#[derive(Clone, Debug)]
pub struct Limits {
    pub max_call_bytes: usize,
    pub max_call_chunks: u32,
    pub max_open_calls: usize,
    pub idle_timeout_ms: i64,
    pub max_call_lifetime_ms: i64,
    pub recently_closed: usize,
}

/// What a call is: a tool call, or a channel that is not one (judged later, never executed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Channel {
    ToolCall,
    Text,
    Refusal,
    Error,
    McpResult,
}

impl Channel {
    pub fn as_str(self) -> &'static str {
        match self {
            Channel::ToolCall => "tool_call",
            Channel::Text => "text",
            Channel::Refusal => "refusal",
            Channel::Error => "error",
            Channel::McpResult => "mcp_result",
        }
    }

    pub fn parse(name: &str) -> Option<Channel> {
        Some(match name {
            "tool_call" => Channel::ToolCall,
            "text" => Channel::Text,
            "refusal" => Channel::Refusal,
            "error" => Channel::Error,
            "mcp_result" => Channel::McpResult,
            _ => return None,
        })
    }
}

/// A stream's finish signal, normalized from every vendor's spelling.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    Stop,
    ToolCalls,
    Length,
    ContentFilter,
    Refusal,
    Error,
}

impl Finish {
    pub fn parse(name: &str) -> Option<Finish> {
        Some(match name {
            "stop" => Finish::Stop,
            "tool_calls" => Finish::ToolCalls,
            "length" => Finish::Length,
            "content_filter" => Finish::ContentFilter,
            "refusal" => Finish::Refusal,
            "error" => Finish::Error,
            _ => return None,
        })
    }

    pub const NAMES: [&'static str; 6] = [
        "content_filter",
        "error",
        "length",
        "refusal",
        "stop",
        "tool_calls",
    ];
}

/// Why a call ended without being complete.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Incomplete {
    MaxTokens,
    ContentFilter,
    StreamEnded,
    Timeout,
    Evicted,
    SequenceGap,
    StreamCorrupt,
    MaxLifetime,
}

impl Incomplete {
    pub fn as_str(self) -> &'static str {
        match self {
            Incomplete::MaxTokens => "max_tokens",
            Incomplete::ContentFilter => "content_filter",
            Incomplete::StreamEnded => "stream_ended",
            Incomplete::Timeout => "timeout",
            Incomplete::Evicted => "evicted",
            Incomplete::SequenceGap => "sequence_gap",
            Incomplete::StreamCorrupt => "stream_corrupt",
            Incomplete::MaxLifetime => "max_lifetime",
        }
    }

    fn after(finish: Option<Finish>) -> Incomplete {
        match finish {
            Some(Finish::Length) => Incomplete::MaxTokens,
            Some(Finish::ContentFilter) => Incomplete::ContentFilter,
            _ => Incomplete::StreamEnded,
        }
    }
}

/// A bound the call went past: its text was dropped, and it is rejected when it ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Overflow {
    TooLarge,
    TooManyChunks,
}

/// Correlation fields copied from the input onto the event, never interpreted.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trace {
    pub trace_id: Option<Box<str>>,
    pub run_id: Option<Box<str>>,
    pub step_id: Option<Box<str>>,
    pub traceparent: Option<Box<str>>,
    pub attempt: Option<u32>,
}

impl Trace {
    pub fn is_empty(&self) -> bool {
        *self == Trace::default()
    }
}

/// One piece of one call of one stream.
#[derive(Clone, Debug)]
pub struct CallPiece {
    pub stream_id: Arc<str>,
    pub call_id: Arc<str>,
    pub channel: Channel,
    pub seq: Option<u32>,
    pub tool: Option<Box<str>>,
    pub tool_version: Option<Box<str>>,
    pub delta: String,
    pub is_final: bool,
    pub idempotency_key: Option<Box<str>>,
    pub trace: Option<Box<Trace>>,
    /// The vendor's own final form of the whole text, checked against the assembled text.
    pub expected: Option<String>,
    /// Whether this piece may open a call (an envelope; an adapter's first piece of a call).
    pub opens: bool,
}

/// What a record brings to the reassembler.
#[derive(Clone, Debug)]
pub enum Piece {
    Call(CallPiece),
    /// The stream ended: its open calls are incomplete.
    End {
        stream_id: Arc<str>,
        finish: Option<Finish>,
    },
    /// The stream's adapter met an event it could not place: this call cannot be trusted.
    Abort {
        stream_id: Arc<str>,
        call_id: Arc<str>,
    },
}

/// How a call ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ending {
    Complete,
    Incomplete(Incomplete),
    Overflow(Overflow),
    Reused,
}

/// A call the reassembler closed, with everything the chain needs to judge it.
#[derive(Clone, Debug)]
pub struct Closed {
    pub stream_id: Arc<str>,
    pub call_id: Arc<str>,
    pub channel: Channel,
    pub tool: Option<Box<str>>,
    pub tool_version: Option<Box<str>>,
    pub idempotency_key: Option<Box<str>>,
    pub trace: Option<Box<Trace>>,
    pub text: Vec<u8>,
    pub first_offset: i64,
    pub last_offset: i64,
    pub chunks: u32,
    pub duplicates: u32,
    /// Bytes received, including any dropped past a bound.
    pub received: u64,
    pub ending: Ending,
    pub busy_ns: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CallKey {
    pub stream_id: Arc<str>,
    pub call_id: Arc<str>,
}

#[derive(Clone, Debug)]
pub(crate) struct OpenCall {
    pub channel: Channel,
    pub tool: Option<Box<str>>,
    pub tool_version: Option<Box<str>>,
    pub idempotency_key: Option<Box<str>>,
    pub trace: Option<Box<Trace>>,
    pub text: Vec<u8>,
    /// Bytes of every piece taken, including those dropped past a bound.
    pub received: u64,
    /// Where each taken piece ends in `text` (until an overflow drops the text).
    pub bounds: Vec<u32>,
    pub first_offset: i64,
    pub last_offset: i64,
    pub first_seen: i64,
    pub chunks: u32,
    pub next_seq: u32,
    pub duplicates: u32,
    pub overflow: Option<Overflow>,
    pub reused: bool,
    /// Bytes of `text` and entries of `bounds` already written by a snapshot or delta.
    pub written: u32,
    pub written_bounds: u32,
    /// The write epoch in which the call last changed.
    pub touched: u64,
    pub busy_ns: u64,
}

/// What is remembered of a closed call, to tell a retransmission from a reuse of its id.
impl OpenCall {
    /// Whether `delta` equals the piece already taken at `seq` (true when the text is gone).
    fn repeats(&self, seq: u32, delta: &[u8]) -> bool {
        let Some(&end) = self.bounds.get(seq as usize) else {
            return self.overflow.is_some();
        };
        let start = if seq == 0 {
            0
        } else {
            self.bounds[seq as usize - 1]
        };
        self.text[start as usize..end as usize] == *delta
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ClosedCall {
    pub complete: bool,
    pub chunks: u32,
    pub hashes: Vec<u64>,
}

/// A stream with open calls.
#[derive(Clone, Debug, Default)]
pub(crate) struct Stream {
    /// Its open calls' ids, in the order they opened.
    pub calls: LinkedHashSet<Arc<str>>,
    /// The partition's time when a record of the stream last arrived.
    pub last_seen: i64,
    /// The write epochs in which it last moved to the back (activity) and last changed.
    pub moved: u64,
    pub changed: u64,
}

#[derive(Default)]
pub(crate) struct Partition {
    pub calls: HashMap<CallKey, OpenCall>,
    /// Streams with open calls, least recently active first.
    pub streams: LinkedHashMap<Arc<str>, Stream>,
    /// Recently closed calls, oldest first.
    pub closed: LinkedHashMap<CallKey, ClosedCall>,
    /// The partition's time: the largest record timestamp seen, in ms.
    pub clock: i64,
    /// The offset after the last record fed.
    pub next_offset: i64,
    /// Counts the snapshots and deltas written; calls touched since carry the current value.
    pub epoch: u64,
    /// Calls removed since the last write, in order.
    pub removed: Vec<CallKey>,
    /// Closed-call entries added since the last write, in order.
    pub newly_closed: Vec<CallKey>,
    /// Streams gone (no call open) since the last write.
    pub removed_streams: Vec<Arc<str>>,
    /// Whether changes are tracked for the next delta (from the first write on).
    pub tracking: bool,
}

/// Totals since the start, for metrics.
#[derive(Clone, Copy, Debug, Default)]
pub struct Counters {
    pub duplicate_chunks: u64,
    pub late_chunks: u64,
    /// Records skipped because they were fed before (offset below the partition's next).
    pub stale_records: u64,
}

/// One partition's scope: (topic, partition).
pub type Scope = (Arc<str>, i32);

pub struct Assembler {
    pub limits: Limits,
    pub(crate) partitions: HashMap<Scope, Partition>,
    pub counters: Counters,
    open: usize,
    buffered: usize,
}

impl Assembler {
    pub fn new(limits: Limits) -> Self {
        Assembler {
            limits,
            partitions: HashMap::new(),
            counters: Counters::default(),
            open: 0,
            buffered: 0,
        }
    }

    pub fn open_calls(&self) -> usize {
        self.open
    }

    pub fn buffered_bytes(&self) -> usize {
        self.buffered
    }

    pub fn clock(&self, scope: &Scope) -> Option<i64> {
        self.partitions.get(scope).map(|p| p.clock)
    }

    pub fn next_offset(&self, scope: &Scope) -> Option<i64> {
        self.partitions.get(scope).map(|p| p.next_offset)
    }

    /// A record begins: advance the partition's time and close what aged out before it.
    /// False (and nothing changes) when the record was fed already: its offset is below the
    /// partition's next one, as when a restored partition is fetched from an earlier offset.
    #[must_use]
    pub fn begin_record(
        &mut self,
        scope: &Scope,
        offset: i64,
        timestamp: Option<i64>,
        out: &mut Vec<Closed>,
    ) -> bool {
        let idle = self.limits.idle_timeout_ms;
        let part = self.partitions.entry(scope.clone()).or_default();
        if offset < part.next_offset {
            self.counters.stale_records += 1;
            return false;
        }
        part.next_offset = offset + 1;
        if let Some(ts) = timestamp {
            part.clock = part.clock.max(ts);
        }
        let deadline = part.clock - idle;
        let mut expired = Vec::new();
        for (stream, state) in part.streams.iter() {
            if state.last_seen > deadline {
                break;
            }
            expired.extend(state.calls.iter().map(|call| CallKey {
                stream_id: stream.clone(),
                call_id: call.clone(),
            }));
        }
        for key in expired {
            self.close(scope, &key, Ending::Incomplete(Incomplete::Timeout), out);
        }
        true
    }

    /// A record of this stream arrived: the stream is active (if it has open calls).
    pub fn touch(&mut self, scope: &Scope, stream_id: &str) {
        let Some(part) = self.partitions.get_mut(scope) else {
            return;
        };
        let (clock, epoch) = (part.clock, part.epoch);
        if let Some(stream) = part.streams.to_back(stream_id) {
            stream.last_seen = clock;
            stream.moved = epoch;
        }
    }

    /// One piece of the record at `offset` (after `begin_record`).
    pub fn feed(&mut self, scope: &Scope, offset: i64, piece: Piece, out: &mut Vec<Closed>) {
        match piece {
            Piece::Call(call) => self.take(scope, offset, call, out),
            Piece::End { stream_id, finish } => {
                self.end_stream(scope, offset, &stream_id, finish, out)
            }
            Piece::Abort { stream_id, call_id } => {
                self.touch(scope, &stream_id);
                let key = CallKey { stream_id, call_id };
                if self.touch_last_offset(scope, &key, offset) {
                    self.close(
                        scope,
                        &key,
                        Ending::Incomplete(Incomplete::StreamCorrupt),
                        out,
                    );
                }
            }
        }
    }

    /// Abort every open call of a stream (a record of it could not be read).
    pub fn abort_stream(
        &mut self,
        scope: &Scope,
        offset: i64,
        stream_id: &str,
        out: &mut Vec<Closed>,
    ) {
        for key in self.stream_calls(scope, stream_id) {
            self.touch_last_offset(scope, &key, offset);
            self.close(
                scope,
                &key,
                Ending::Incomplete(Incomplete::StreamCorrupt),
                out,
            );
        }
    }

    /// End of all input (offline): every open call ends `stream_ended`, partition by
    /// partition, least recently active first.
    pub fn flush(&mut self) -> Vec<(Scope, Vec<Closed>)> {
        let mut scopes: Vec<Scope> = self.partitions.keys().cloned().collect();
        scopes.sort();
        let mut closed = Vec::new();
        for scope in scopes {
            let keys: Vec<CallKey> = self.partitions[&scope]
                .streams
                .iter()
                .flat_map(|(stream, state)| {
                    state.calls.iter().map(|call| CallKey {
                        stream_id: stream.clone(),
                        call_id: call.clone(),
                    })
                })
                .collect();
            let mut out = Vec::new();
            for key in keys {
                self.close(
                    &scope,
                    &key,
                    Ending::Incomplete(Incomplete::StreamEnded),
                    &mut out,
                );
            }
            closed.push((scope, out));
        }
        closed
    }

    /// Take over a partition's state rebuilt elsewhere (a restore).
    pub(crate) fn adopt(&mut self, scope: Scope, part: Partition) {
        self.open += part.calls.len();
        self.buffered += part.calls.values().map(|c| c.text.len()).sum::<usize>();
        self.partitions.insert(scope, part);
    }

    /// Forget a partition (revoked): its next owner restores it.
    pub fn drop_partition(&mut self, scope: &Scope) {
        if let Some(part) = self.partitions.remove(scope) {
            self.open -= part.calls.len();
            self.buffered -= part.calls.values().map(|c| c.text.len()).sum::<usize>();
        }
    }

    fn stream_calls(&self, scope: &Scope, stream_id: &str) -> Vec<CallKey> {
        let Some(part) = self.partitions.get(scope) else {
            return Vec::new();
        };
        let Some((stream, state)) = part.streams.get_key_value(stream_id) else {
            return Vec::new();
        };
        state
            .calls
            .iter()
            .map(|id| CallKey {
                stream_id: stream.clone(),
                call_id: id.clone(),
            })
            .collect()
    }

    fn touch_last_offset(&mut self, scope: &Scope, key: &CallKey, offset: i64) -> bool {
        let Some(part) = self.partitions.get_mut(scope) else {
            return false;
        };
        match part.calls.get_mut(key) {
            Some(call) => {
                call.last_offset = offset;
                true
            }
            None => false,
        }
    }

    fn end_stream(
        &mut self,
        scope: &Scope,
        offset: i64,
        stream_id: &str,
        finish: Option<Finish>,
        out: &mut Vec<Closed>,
    ) {
        let reason = Incomplete::after(finish);
        for key in self.stream_calls(scope, stream_id) {
            self.touch_last_offset(scope, &key, offset);
            self.close(scope, &key, Ending::Incomplete(reason), out);
        }
    }

    fn take(&mut self, scope: &Scope, offset: i64, piece: CallPiece, out: &mut Vec<Closed>) {
        let started = Instant::now();
        let key = CallKey {
            stream_id: piece.stream_id.clone(),
            call_id: piece.call_id.clone(),
        };
        let lifetime = self.limits.max_call_lifetime_ms;
        self.touch(scope, &key.stream_id);
        let part = self.partitions.get_mut(scope).expect("begin_record first");
        let now = part.clock;
        let opening = match part.calls.get_mut(&key) {
            Some(call) if now - call.first_seen >= lifetime => {
                call.last_offset = offset;
                self.close(
                    scope,
                    &key,
                    Ending::Incomplete(Incomplete::MaxLifetime),
                    out,
                );
                self.counters.late_chunks += 1;
                return;
            }
            Some(_) => None,
            None => match part
                .closed
                .get(&key)
                .map(|closed| late_piece(closed, &piece))
            {
                Some(Late::Retransmission) => {
                    self.counters.duplicate_chunks += 1;
                    return;
                }
                Some(Late::Tail) => {
                    self.counters.late_chunks += 1;
                    return;
                }
                Some(Late::Reuse) => Some(true),
                None if piece.opens => Some(false),
                None => {
                    // the continuation of a call judged and forgotten
                    self.counters.late_chunks += 1;
                    return;
                }
            },
        };
        if let Some(reused) = opening {
            self.open_call(scope, &key, &piece, offset, reused, out);
        }
        let step = self.append(scope, &key, offset, piece, started);
        if let Some(ending) = step {
            self.close(scope, &key, ending, out);
        }
    }

    fn open_call(
        &mut self,
        scope: &Scope,
        key: &CallKey,
        piece: &CallPiece,
        offset: i64,
        reused: bool,
        out: &mut Vec<Closed>,
    ) {
        let oldest = {
            let part = &self.partitions[scope];
            if part.calls.len() >= self.limits.max_open_calls {
                part.streams.front().and_then(|(stream, state)| {
                    state.calls.front().map(|call| CallKey {
                        stream_id: stream.clone(),
                        call_id: call.clone(),
                    })
                })
            } else {
                None
            }
        };
        if let Some(oldest) = oldest {
            self.close(scope, &oldest, Ending::Incomplete(Incomplete::Evicted), out);
        }
        let part = self.partitions.get_mut(scope).expect("begin_record first");
        let call = OpenCall {
            channel: piece.channel,
            tool: None,
            tool_version: None,
            idempotency_key: None,
            trace: None,
            text: Vec::new(),
            bounds: Vec::new(),
            received: 0,
            first_offset: offset,
            last_offset: offset,
            first_seen: part.clock,
            chunks: 0,
            // a reused id is judged as its own call whatever its numbering
            next_seq: if reused { piece.seq.unwrap_or(0) } else { 0 },
            duplicates: 0,
            overflow: None,
            reused,
            written: 0,
            written_bounds: 0,
            touched: part.epoch,
            busy_ns: 0,
        };
        part.calls.insert(key.clone(), call);
        let (clock, epoch) = (part.clock, part.epoch);
        if !part.streams.contains_key(&key.stream_id) {
            part.streams
                .insert(key.stream_id.clone(), Stream::default());
        }
        let stream = part
            .streams
            .to_back(&key.stream_id)
            .expect("just made sure of");
        stream.calls.insert(key.call_id.clone());
        stream.last_seen = clock;
        stream.moved = epoch;
        self.open += 1;
    }

    /// Take a piece into its open call; the ending when the piece ends the call.
    fn append(
        &mut self,
        scope: &Scope,
        key: &CallKey,
        offset: i64,
        piece: CallPiece,
        started: Instant,
    ) -> Option<Ending> {
        let limits = &self.limits;
        let part = self.partitions.get_mut(scope).expect("begin_record first");
        let epoch = part.epoch;
        let call = part.calls.get_mut(key).expect("opened above");
        call.last_offset = offset;
        call.touched = epoch;
        if contradicts(call, &piece) {
            return Some(Ending::Incomplete(Incomplete::StreamCorrupt));
        }
        if let Some(seq) = piece.seq {
            if seq < call.next_seq {
                if !call.repeats(seq, piece.delta.as_bytes()) {
                    return Some(Ending::Incomplete(Incomplete::StreamCorrupt));
                }
                call.duplicates += 1;
                self.counters.duplicate_chunks += 1;
                return None;
            }
            if seq > call.next_seq {
                return Some(Ending::Incomplete(Incomplete::SequenceGap));
            }
        }
        call.next_seq += 1;
        call.chunks += 1;
        call.received += piece.delta.len() as u64;
        if call.tool.is_none() && piece.tool.is_some() {
            call.tool = piece.tool;
            call.tool_version = piece.tool_version;
        } else if call.tool_version.is_none() {
            call.tool_version = piece.tool_version;
        }
        if call.idempotency_key.is_none() {
            call.idempotency_key = piece.idempotency_key;
        }
        if call.trace.is_none() {
            call.trace = piece.trace;
        }
        if call.overflow.is_none() {
            let overflow = if call.text.len() + piece.delta.len() > limits.max_call_bytes {
                Some(Overflow::TooLarge)
            } else if call.chunks > limits.max_call_chunks {
                Some(Overflow::TooManyChunks)
            } else {
                None
            };
            match overflow {
                Some(overflow) => {
                    self.buffered -= call.text.len();
                    call.overflow = Some(overflow);
                    call.text = Vec::new();
                    call.bounds = Vec::new();
                }
                None => {
                    call.text.extend_from_slice(piece.delta.as_bytes());
                    call.bounds.push(call.text.len() as u32);
                    self.buffered += piece.delta.len();
                }
            }
        }
        call.busy_ns += started.elapsed().as_nanos() as u64;
        if !piece.is_final {
            return None;
        }
        match piece.expected {
            Some(expected) if call.overflow.is_none() && *expected.as_bytes() != call.text[..] => {
                Some(Ending::Incomplete(Incomplete::StreamCorrupt))
            }
            _ => Some(Ending::Complete),
        }
    }

    fn close(&mut self, scope: &Scope, key: &CallKey, ending: Ending, out: &mut Vec<Closed>) {
        let started = Instant::now();
        let recently_closed = self.limits.recently_closed;
        let part = self
            .partitions
            .get_mut(scope)
            .expect("a partition with calls");
        let Some(call) = part.calls.remove(key) else {
            return;
        };
        self.open -= 1;
        self.buffered -= call.text.len();
        if let Some(stream) = part.streams.get_mut(&key.stream_id) {
            stream.calls.remove(&key.call_id);
            stream.changed = part.epoch;
            if stream.calls.is_empty() {
                part.streams.remove(&key.stream_id);
                if part.tracking {
                    part.removed_streams.push(key.stream_id.clone());
                }
            }
        }
        let ending = match ending {
            _ if call.reused => Ending::Reused,
            Ending::Complete => match call.overflow {
                Some(overflow) => Ending::Overflow(overflow),
                None => Ending::Complete,
            },
            other => other,
        };
        let remembered = ClosedCall {
            complete: matches!(
                ending,
                Ending::Complete | Ending::Overflow(_) | Ending::Reused
            ),
            chunks: call.chunks,
            hashes: piece_hashes(&call),
        };
        part.closed.remove(key);
        part.closed.insert(key.clone(), remembered);
        if part.closed.len() > recently_closed {
            part.closed.pop_front();
        }
        if part.tracking {
            part.removed.push(key.clone());
            part.newly_closed.push(key.clone());
        }
        let busy_ns = call.busy_ns + started.elapsed().as_nanos() as u64;
        out.push(Closed {
            stream_id: key.stream_id.clone(),
            call_id: key.call_id.clone(),
            channel: call.channel,
            tool: call.tool,
            tool_version: call.tool_version,
            idempotency_key: call.idempotency_key,
            trace: call.trace,
            text: if matches!(ending, Ending::Complete) {
                call.text
            } else {
                Vec::new()
            },
            first_offset: call.first_offset,
            last_offset: call.last_offset,
            chunks: call.chunks,
            duplicates: call.duplicates,
            received: call.received,
            ending,
            busy_ns,
        });
    }
}

/// A piece under the id of a call already closed.
#[derive(Debug, PartialEq, Eq)]
enum Late {
    Retransmission,
    Tail,
    Reuse,
}

fn late_piece(closed: &ClosedCall, piece: &CallPiece) -> Late {
    let hash = xxh3_64(piece.delta.as_bytes());
    match piece.seq {
        Some(seq) if seq < closed.chunks => match closed.hashes.get(seq as usize) {
            Some(known) if *known != hash => {
                if closed.complete || seq == 0 {
                    Late::Reuse
                } else {
                    Late::Tail
                }
            }
            _ => Late::Retransmission,
        },
        Some(_) | None if closed.complete => {
            if piece.seq.is_none() && closed.hashes.contains(&hash) {
                Late::Retransmission
            } else {
                Late::Reuse
            }
        }
        None if closed.hashes.contains(&hash) => Late::Retransmission,
        None if piece.tool.is_some() => Late::Reuse,
        _ => Late::Tail,
    }
}

fn piece_hashes(call: &OpenCall) -> Vec<u64> {
    let mut start = 0usize;
    call.bounds
        .iter()
        .take(HASHED_PIECES)
        .map(|&end| {
            let hash = xxh3_64(&call.text[start..end as usize]);
            start = end as usize;
            hash
        })
        .collect()
}

/// A piece that names another channel, tool, version or key than its call already has.
fn contradicts(call: &OpenCall, piece: &CallPiece) -> bool {
    fn differs(known: &Option<Box<str>>, given: &Option<Box<str>>) -> bool {
        matches!((known, given), (Some(a), Some(b)) if a != b)
    }
    piece.channel != call.channel
        || differs(&call.tool, &piece.tool)
        || differs(&call.tool_version, &piece.tool_version)
        || differs(&call.idempotency_key, &piece.idempotency_key)
}
