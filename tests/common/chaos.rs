//! The stale-owner chaos contract, for any backend: two overlapping owners
//! of a partition, the old one stalled mid-batch and then resuming after
//! the new one has applied and committed the rest of the log. The old
//! owner must be fenced, and the documents must equal the reference model.
//! Run on the stateful test store of `tests/elastic_contracts.rs` and on
//! the Elasticsearch-API server of the suite (`tests/scenarios.rs`).

use denorm::apply::{apply, FanOut};
use denorm::command::Command;
use denorm::index::{Backend, Checkpoint, Doc, IndexError, Shard};

/// A seeded log of upserts, deletes, directory renames and file renames
/// over twelve files in three directories of one tree.
pub fn chaos_log(seed: u64, n: usize) -> Vec<Command> {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut next = |m: u64| {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (x >> 33) % m
    };
    let dirs = ["/a/x", "/a/y", "/a/z"];
    let mut model = denorm::model::Model::default();
    let mut log = Vec::new();
    for _ in 0..n {
        let id = format!("f{}", next(12));
        let c = match next(10) {
            0..=4 => Command::UpsertFile { id: id.clone(), path: format!("{}/{id}.txt", dirs[next(3) as usize]), contents: format!("v{}", next(1000)), previous_path: None },
            5 | 6 => Command::DeleteFile { path: model.file_path(&id).unwrap_or("/a/x/gone.txt").to_string(), id },
            7 | 8 => {
                let (from, to) = (next(3) as usize, next(3) as usize);
                if from == to {
                    continue;
                }
                Command::RenamePath { from: dirs[from].into(), to: dirs[to].into() }
            }
            _ => match model.file_path(&id) {
                Some(p) => Command::RenamePath { from: p.to_string(), to: format!("{}/{id}-moved.txt", dirs[next(3) as usize]) },
                None => continue,
            },
        };
        model.apply(&c);
        log.push(c);
    }
    log
}

/// Runs the contract of the module's doc for `seed` on partition 0 of `b`,
/// then compares `live()` (every live document) with the model.
pub fn two_overlapping_owners(b: &dyn Backend, seed: u64, live: impl Fn() -> Vec<Doc>) {
    let log = chaos_log(seed, 90);
    let (committed, stalled, resumed) = (log.len() / 3, log.len() / 2, log.len() / 2 + 6);
    let run = |shard: &mut Box<dyn Shard + Send>, range: std::ops::Range<usize>, commit: bool| -> Result<(), IndexError> {
        for i in range {
            apply(shard.as_mut(), &log[i], i as u64, FanOut::pages_of(4))?;
            shard.mark_applied(Checkpoint::new(i as u64, i as u64));
            if commit && i % 7 == 6 {
                shard.commit()?;
            }
        }
        Ok(())
    };
    let mut old = b.open_shard(0).unwrap();
    run(&mut old, 0..committed, true).unwrap();
    old.commit().unwrap();
    run(&mut old, committed..stalled, false).unwrap();
    // The old owner stalls; the new one resumes from its checkpoint.
    let mut new = b.open_shard(0).unwrap();
    let from = new.checkpoint().map_or(0, |c| c.offset as usize + 1);
    assert_eq!(from, committed, "seed {seed}");
    run(&mut new, from..log.len(), true).unwrap();
    new.commit().unwrap();
    // The old owner resumes.
    let resumed_result = run(&mut old, stalled..resumed, false).and_then(|_| old.commit());
    assert!(matches!(resumed_result, Err(IndexError::Fenced(_))), "seed {seed}: {resumed_result:?}");
    let mut model = denorm::model::Model::default();
    log.iter().for_each(|c| model.apply(c));
    let diffs = denorm::model::diff(model.docs(), live(), 10);
    assert!(diffs.is_empty(), "seed {seed}: the documents differ from the model:\n{}", diffs.join("\n"));
}
