//! Fuzzes everything a hostile message reaches before it is applied: Avro
//! single-object decoding, command validation and key checks. Must never
//! panic, hang or allocate without bound. The properties checked are
//! `denorm::worker::admit::fuzz_input`'s (in the crate, so that they
//! compile with it and the suite runs them on the seeds). Each input is
//! read by a worker of the compiled-in kinds and by workers of both
//! shipped models (`models/`), whose commands and JSONL it reaches too.
#![no_main]

use denorm::codec::Codec;
use denorm::domain::Domain;
use libfuzzer_sys::fuzz_target;

fn with_model(name: &str, text: &str) -> Codec {
    Codec::new().with_model(Domain::parse(name, text).expect("a shipped model").interned())
}

thread_local! {
    static CODECS: [Codec; 3] = [
        Codec::new(),
        with_model("shop.toml", include_str!("../../models/shop.toml")),
        with_model("files-and-posts.toml", include_str!("../../models/files-and-posts.toml")),
    ];
}

fuzz_target!(|data: &[u8]| {
    CODECS.with(|codecs| {
        for c in codecs {
            denorm::worker::admit::fuzz_input(c, data);
        }
    });
});
