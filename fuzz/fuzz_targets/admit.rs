//! Fuzzes everything a hostile message reaches before it is applied: Avro
//! single-object decoding, command validation and key checks. Must never
//! panic, hang or allocate without bound.
#![no_main]

use denorm::codec::Codec;
use denorm::worker::admit::admit;
use libfuzzer_sys::fuzz_target;

thread_local! {
    static CODEC: Codec = Codec::new();
}

fuzz_target!(|data: &[u8]| {
    // First byte splits key from payload, so keys are fuzzed too.
    let (key, payload) = match data.split_first() {
        Some((&n, rest)) => rest.split_at((n as usize).min(rest.len())),
        None => (&[][..], data),
    };
    CODEC.with(|c| {
        if let Ok(e) = admit(c, Some(key), Some(payload), 1 << 20) {
            // Whatever is admitted re-encodes and decodes to itself.
            assert_eq!(c.decode(&c.encode(&e)).unwrap(), e);
        }
        if let Ok(line) = std::str::from_utf8(payload) {
            let _ = denorm::command::jsonl::parse_line(1, line);
        }
    });
});
