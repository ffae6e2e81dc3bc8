//! What the embedded index's owner audit costs: the time
//! `EmbeddedIndex::held_by_several_partitions` takes over six shards
//! holding SIZE documents in all (default 1,000,000), with 100 documents
//! held by two shards. Prints the figure; writes only a temporary
//! directory.
//!
//! ```sh
//! cargo run --release --example owner_audit_cost [-- SIZE]
//! ```

use std::time::Instant;

use denorm::index::embedded::EmbeddedIndex;
use denorm::index::{Doc, FileDoc, Shard};

fn main() {
    let size: u64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(1_000_000);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let index = EmbeddedIndex::open(dir.path(), "audit").expect("the index");
    index.bind_log(6).expect("bind");
    let t = Instant::now();
    for p in 0..6 {
        let mut shard = index.open_shard(p, 256 << 20).expect("a shard");
        for i in (p as u64..size).step_by(6) {
            shard.put(Doc::File(FileDoc::at(&format!("f{i}"), &format!("/t{p}/d{}/f{i}.txt", i % 100), "x", i))).unwrap();
        }
        // 100 documents of partition 0 also under partition 1.
        if p == 1 {
            for i in (0..600).step_by(6) {
                shard.put(Doc::File(FileDoc::at(&format!("f{i}"), &format!("/t1/dup/f{i}.txt"), "x", i))).unwrap();
            }
        }
        shard.mark_applied(denorm::index::Checkpoint::new(size, 0));
        shard.commit().expect("commit");
    }
    eprintln!("indexed {size} documents in 6 shards in {:.1}s", t.elapsed().as_secs_f64());
    for _ in 0..3 {
        let t = Instant::now();
        let found = index.held_by_several_partitions().expect("audit");
        println!("owner audit: {} documents under two keys found among {size} in {:.2}s", found.len(), t.elapsed().as_secs_f64());
        assert_eq!(found.len(), 100);
    }
}
