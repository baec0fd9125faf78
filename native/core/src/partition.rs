//! Kafka's default partitioner: which partition a keyed record goes to, as the Java client
//! decides it (murmur2 of the key, made positive, modulo the partition count). Every record of
//! one key lands in one partition, whichever client wrote it.

/// The Java client's `Utils.murmur2`.
pub fn murmur2(data: &[u8]) -> u32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut h: u32 = SEED ^ data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if !rest.is_empty() {
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h
}

/// The index (0..partitions) of the partition a record with this key goes to; None for no
/// partitions (a topic has at least one).
pub fn partition_for_key(key: &[u8], partitions: u32) -> Option<u32> {
    (partitions > 0).then(|| (murmur2(key) & 0x7fff_ffff) % partitions)
}

#[cfg(test)]
mod tests {
    use super::murmur2;

    #[test]
    fn the_java_clients_values() {
        // from the Java client's UtilsTest.testMurmur2 (signed ints there)
        let cases: [(&[u8], i32); 6] = [
            (b"21", -973932308),
            (b"foobar", -790332482),
            (b"a-little-bit-long-string", -985981536),
            (b"a-little-bit-longer-string", -1486304829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58897971,
            ),
            (b"abc", 479470107),
        ];
        for (data, expected) in cases {
            assert_eq!(
                murmur2(data) as i32,
                expected,
                "{:?}",
                String::from_utf8_lossy(data)
            );
        }
    }
}
