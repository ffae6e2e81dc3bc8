//! Fuzzes everything a hostile message reaches before it is applied: Avro
//! single-object decoding, command validation and key checks. Must never
//! panic, hang or allocate without bound. The properties checked are
//! `denorm::worker::admit::fuzz_input`'s (in the crate, so that they
//! compile with it and the suite runs them on the seeds).
#![no_main]

use denorm::codec::Codec;
use libfuzzer_sys::fuzz_target;

thread_local! {
    static CODEC: Codec = Codec::new();
}

fuzz_target!(|data: &[u8]| {
    CODEC.with(|c| {
        denorm::worker::admit::fuzz_input(c, data);
    });
});
