//! Fuzzes everything a hostile message reaches before it is applied: Avro
//! single-object decoding, command validation and key checks. Must never
//! panic, hang or allocate without bound.
#![no_main]

use denorm::codec::Codec;
use denorm::worker::admit::{admit, Admitted};
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
        // Whatever is admitted re-encodes and decodes to itself.
        match admit(c, Some(key), Some(payload), 1 << 20) {
            Ok(Admitted::Command(e)) => assert_eq!(c.decode(&c.encode(&e)).unwrap(), e),
            Ok(Admitted::Control(x)) => {
                assert_eq!(c.decode_message(&c.encode_control(&x)).unwrap(), denorm::codec::Decoded::Control(x))
            }
            Ok(Admitted::Move(m)) => assert_eq!(c.decode_message(&c.encode_move(&m)).unwrap(), denorm::codec::Decoded::Move(m)),
            Err(_) => {}
        }
        if let Ok(line) = std::str::from_utf8(payload) {
            let _ = denorm::command::jsonl::parse_line(1, line);
        }
    });
});
