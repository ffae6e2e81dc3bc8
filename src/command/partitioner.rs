//! Where a key's messages go: the Java client's default partitioner, which
//! `denorm produce`, the workers' moves and every supported producer use.

/// Java's murmur2 (as Kafka's default partitioner and librdkafka's
/// `murmur2_random` hash keys).
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let len = data.len();
    let mut h: u32 = SEED ^ (len as u32);
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
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
    h as i32
}

/// The partition of `key` among `partitions` under the Java client's
/// default partitioner (what `denorm produce` and the workers use).
pub fn partition_of(key: &str, partitions: i32) -> i32 {
    partition_of_bytes(key.as_bytes(), partitions)
}

/// [`partition_of`] for a key as it is on the wire.
pub fn partition_of_bytes(key: &[u8], partitions: i32) -> i32 {
    (murmur2(key) & 0x7fff_ffff) % partitions.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn murmur2_matches_the_java_client() {
        // Kafka's UtilsTest vectors.
        for (s, want) in [
            ("21", -973932308),
            ("foobar", -790332482),
            ("a-little-bit-long-string", -985981536),
            ("a-little-bit-longer-string", -1486304829),
            ("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
            ("abc", 479470107),
        ] {
            assert_eq!(murmur2(s.as_bytes()), want, "{s}");
        }
    }
}
