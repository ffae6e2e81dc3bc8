//! A declared model's commands applied to a shard, through the same
//! `apply` the worker runs, give the documents of the model's reference
//! (`model::generic`), on the in-memory shard, the embedded index's and
//! Elasticsearch's (the suite's Elasticsearch-API server), whether its
//! fan-outs run whole or a page at a time, and again when the end of the
//! log is applied twice.

use denorm::apply::{apply, fan_out_rest, fan_out_scan, FanOut};
use denorm::command::generic::bound::Bound;
use denorm::command::generic::{legacy, ModelEnvelope};
use denorm::command::{tenant, Command, Envelope};
use denorm::domain::Domain;
use denorm::index::embedded::EmbeddedIndex;
use denorm::index::memory::MemoryShard;
use denorm::index::{Doc, Kind, ModelKind, SearchIndex, Shard};
use denorm::model::generic::{DocKey, ModelReference};

use crate::common::shop::{self, ShopLog};

/// How a fan-out the worker can page is run.
#[derive(Clone, Copy, Debug)]
enum Driver {
    Whole,
    Paged,
}

fn applied(shard: &mut dyn Shard, d: &'static Domain, log: &[ModelEnvelope], first_pos: u64, driver: Driver, commit_every: usize) {
    for (i, e) in log.iter().enumerate() {
        let env = Bound::envelope(d, e.clone());
        let pos = first_pos + i as u64;
        let cmd = &env.command;
        assert_eq!(cmd.validate(), Ok(()), "{e:?}");
        match (driver, fan_out_scan(cmd)) {
            (Driver::Paged, Some(scan)) => {
                let mut pages = shard.rewrite_begin(&scan, 2).unwrap();
                fan_out_rest(shard, cmd, pos, &mut pages).unwrap()
            }
            _ => apply(shard, cmd, pos, FanOut::pages_of(2)).unwrap(),
        };
        if commit_every > 0 && i % commit_every == commit_every - 1 {
            shard.commit().unwrap();
        }
    }
}

/// Every document the reference holds, and every id the log names that it
/// does not, read from `shard`.
pub(crate) fn assert_same(shard: &mut dyn Shard, d: &'static Domain, reference: &ModelReference, log: &[ModelEnvelope], what: &str) {
    let mut keys: std::collections::BTreeSet<DocKey> = reference.docs().keys().cloned().collect();
    for e in log {
        if let Some(id) = e.command.op.id() {
            keys.insert(DocKey { tenant: e.tenant.clone(), kind: e.command.kind.clone(), id: id.to_string() });
        }
    }
    let mut found = 0;
    for k in keys {
        let kind = ModelKind::of(d, &k.kind).unwrap();
        let got = shard.get(Kind::Model(kind), &tenant::scope(k.tenant.as_deref(), &k.id)).unwrap();
        let got = got.map(|doc| match doc {
            Doc::Model(m) => (m.fields, m.copies),
            other => panic!("{what}: {k:?} is {other:?}"),
        });
        let expected = reference.docs().get(&k).map(|s| (s.fields.clone(), s.copies.clone()));
        found += expected.is_some() as usize;
        assert_eq!(got, expected, "{what}: {k:?}");
    }
    assert!(found > 10, "{what}: only {found} documents: the log is too thin to test anything");
}

pub(crate) fn reference_of(d: &Domain, log: &[ModelEnvelope]) -> ModelReference {
    let mut r = ModelReference::new(d.clone());
    for e in log {
        r.apply(e);
    }
    r
}

fn check(d: &'static Domain, log: &[ModelEnvelope], seed: u64) {
    let reference = reference_of(d, log);
    for driver in [Driver::Whole, Driver::Paged] {
        let mut memory = MemoryShard::new();
        applied(&mut memory, d, log, 1, driver, 0);
        assert_same(&mut memory, d, &reference, log, &format!("memory, {driver:?}, seed {seed}"));
        // The end of the log again, at its own positions (a redelivery
        // from a checkpoint): the same documents.
        let tail = log.len().saturating_sub(40);
        applied(&mut memory, d, &log[tail..], 1 + tail as u64, driver, 0);
        assert_same(&mut memory, d, &reference, log, &format!("memory, tail again, {driver:?}, seed {seed}"));

        let dir = tempfile::tempdir().unwrap();
        let index = EmbeddedIndex::open(dir.path(), "shop-log").unwrap().with_model(Some(d));
        let mut shard = index.open_shard(0, 20 << 20).unwrap();
        applied(&mut shard, d, log, 1, driver, 17);
        assert_same(&mut shard, d, &reference, log, &format!("embedded, {driver:?}, seed {seed}"));
        shard.commit().unwrap();
        drop(shard);
        // Read back from what tantivy stored.
        let mut shard = index.open_shard(0, 20 << 20).unwrap();
        assert_same(&mut shard, d, &reference, log, &format!("embedded, reopened, {driver:?}, seed {seed}"));
        // A dump of the index gives each document once, and its nested
        // objects within it.
        let mut dumped = std::collections::BTreeMap::new();
        index
            .search()
            .unwrap()
            .dump(&mut |doc| {
                let Doc::Model(m) = doc else { panic!("{doc:?}") };
                let key = DocKey { tenant: tenant::of(&m.id).map(str::to_string), kind: m.kind.as_str().to_string(), id: tenant::unscoped(&m.id).to_string() };
                assert!(dumped.insert(key, (m.fields, m.copies)).is_none(), "dumped twice");
            })
            .unwrap();
        let expected: std::collections::BTreeMap<_, _> = reference.docs().iter().map(|(k, s)| (k.clone(), (s.fields.clone(), s.copies.clone()))).collect();
        assert!(dumped == expected, "embedded, dumped, {driver:?}, seed {seed}: {} documents, {} expected", dumped.len(), expected.len());
        applied(&mut shard, d, &log[tail..], 1 + tail as u64, driver, 0);
        assert_same(&mut shard, d, &reference, log, &format!("embedded, tail again, {driver:?}, seed {seed}"));
    }
}

#[test]
fn the_shop_models_commands_leave_on_both_shards_the_documents_of_its_reference() {
    let d = shop::model().interned();
    for seed in 0..6 {
        let log = ShopLog::new(seed).commands(d, 300);
        check(d, &log, seed);
    }
}

/// The seeds' domain as a declared model: a profile change is an owner
/// whose copies one kind carries, a fan-out the worker pages.
#[test]
fn the_files_and_posts_models_commands_leave_on_both_shards_the_documents_of_its_reference() {
    let d = legacy::domain();
    let mut commands = denorm::demo::seed(60, 8, 80, 3);
    commands.extend(denorm::demo::user_renames(20, 4));
    commands.push(Command::RenamePath { from: "/clinton/projects".into(), to: "/clinton/work".into() });
    commands.extend(denorm::demo::user_renames(10, 5));
    let log: Vec<ModelEnvelope> = commands.into_iter().map(|c| legacy::to_model(&Envelope::new(c))).collect();
    assert!(log.iter().any(|e| fan_out_scan(&Bound::envelope(d, e.clone()).command).is_some()), "some fan-out is paged");
    check(d, &log, 3);
}

/// The same logs on an Elasticsearch shard, whose indexes of the model's
/// kinds startup creates: realtime reads of what it wrote, fan-outs whose
/// scans search what a refresh published and what it wrote since.
#[test]
fn both_models_commands_leave_on_an_elasticsearch_shard_the_documents_of_their_reference() {
    let es = crate::common::elastic::elastic();
    let rt = crate::common::rt();
    let base = crate::common::elastic::prefix();
    let shop = shop::model().interned();
    let files = legacy::domain();
    let mut commands = denorm::demo::seed(30, 6, 40, 3);
    commands.extend(denorm::demo::user_renames(10, 4));
    commands.push(Command::RenamePath { from: "/clinton/projects".into(), to: "/clinton/work".into() });
    let files_log: Vec<ModelEnvelope> = commands.into_iter().map(|c| legacy::to_model(&Envelope::new(c))).collect();
    let cases = [(shop, ShopLog::new(1).commands(shop, 200), Driver::Whole), (shop, ShopLog::new(2).commands(shop, 200), Driver::Paged), (files, files_log, Driver::Paged)];
    for (i, (d, log, driver)) in cases.into_iter().enumerate() {
        let reference = reference_of(d, &log);
        let mut backend = es.backend(&rt, "model-log");
        backend.prefix = format!("{base}-m{i}");
        backend.model = Some(d);
        crate::common::elastic::remove_when_done(&backend.prefix);
        rt.block_on(denorm::index::elastic::setup::ensure(&backend.client, &backend.prefix, 1, &Default::default(), Some(d))).unwrap();
        let mut shard = denorm::index::Backend::open_shard(&backend, 0).unwrap();
        applied(shard.as_mut(), d, &log, 1, driver, 17);
        shard.commit().unwrap();
        let what = format!("elasticsearch, {} model, {driver:?}", d.name);
        assert_same(shard.as_mut(), d, &reference, &log, &what);
        let tail = log.len().saturating_sub(40);
        applied(shard.as_mut(), d, &log[tail..], 1 + tail as u64, driver, 0);
        shard.commit().unwrap();
        assert_same(shard.as_mut(), d, &reference, &log, &format!("{what}, tail again"));
    }
}

/// `c` as the same command of the files-and-posts model `d`.
pub(crate) fn as_files_and_posts(d: &'static Domain, c: &Command) -> Command {
    legacy::command_of(d, &Envelope::new(c.clone()))
}

/// The documents of `shard` equal the reference of the compiled-in `log`
/// read as the files-and-posts model's commands.
pub(crate) fn assert_files_and_posts_reference(shard: &mut dyn Shard, d: &'static Domain, log: &[Command], what: &str) {
    let log: Vec<ModelEnvelope> = log.iter().map(|c| legacy::to_model(&Envelope::new(c.clone()))).collect();
    assert_same(shard, d, &reference_of(d, &log), &log, what);
}

/// The read-ahead contract (`tests/it/common/read_ahead.rs`) with the
/// model's commands: a window of its owners' upserts whose dependents
/// were read ahead together, with writes of their keys in between.
#[test]
fn a_models_owner_upserts_read_ahead_give_its_reference_on_both_backends() {
    let d = legacy::domain();
    let dir = tempfile::tempdir().unwrap();
    let embedded = denorm::index::embedded::EmbeddedBackend::new(EmbeddedIndex::open(dir.path(), "ahead").unwrap().with_model(Some(d)), 20 << 20);
    let log = crate::common::read_ahead::profile_changes_read_ahead_as(&embedded, &mut || {}, &|c| as_files_and_posts(d, c));
    let mut shard = denorm::index::Backend::open_shard(&embedded, 0).unwrap();
    assert_files_and_posts_reference(shard.as_mut(), d, &log, "embedded");

    let es = crate::common::elastic::elastic();
    let rt = crate::common::rt();
    let mut backend = es.backend(&rt, "model-ahead");
    backend.prefix = format!("{}-ahead", crate::common::elastic::prefix());
    backend.model = Some(d);
    crate::common::elastic::remove_when_done(&backend.prefix);
    rt.block_on(denorm::index::elastic::setup::ensure(&backend.client, &backend.prefix, 1, &Default::default(), Some(d))).unwrap();
    let log = crate::common::read_ahead::profile_changes_read_ahead_as(&backend, &mut || {}, &|c| as_files_and_posts(d, c));
    let mut shard = denorm::index::Backend::open_shard(&backend, 0).unwrap();
    assert_files_and_posts_reference(shard.as_mut(), d, &log, "elasticsearch");
}
