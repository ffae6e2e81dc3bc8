use super::legacy as legacy_docs;
use super::*;
use crate::command::generic::jsonl::parse_all;
use crate::command::generic::legacy;
use crate::command::{Command, Envelope};

fn load(file: &str, text: &str) -> Domain {
    Domain::parse(file, text).unwrap()
}

fn shop() -> Domain {
    load("shop.toml", include_str!("../../../models/shop.toml"))
}

fn applied(d: &Domain, log: &str) -> ModelReference {
    let mut r = ModelReference::new(d.clone());
    for e in parse_all(d, log.as_bytes()).unwrap() {
        r.apply(&e);
    }
    r
}

fn doc<'r>(r: &'r ModelReference, tenant: Option<&str>, kind: &str, id: &str) -> Option<&'r StoredDoc> {
    r.docs().get(&DocKey { tenant: tenant.map(str::to_string), kind: kind.into(), id: id.into() })
}

fn copy(r: &ModelReference, tenant: Option<&str>, kind: &str, id: &str, name: &str) -> Vec<(String, Value)> {
    doc(r, tenant, kind, id).unwrap().copies[name].clone().into_iter().collect()
}

fn s(v: &str) -> Value {
    Value::Str(v.into())
}

const CUSTOMER: &str = r#"{"op":"upsert","kind":"customer","id":"c1","fields":{"name":"Ann","plan":"free","since":"2026-01-02"}}"#;
const ORDER: &str = r#"{"op":"upsert","kind":"order","id":"o1","fields":{"customer_id":"c1","placed":"2026-12-04","status":"open","total":9}}"#;
const TICKET: &str = r#"{"op":"upsert","kind":"ticket","id":"t1","fields":{"customer_id":"c1","subject":"Broken","open":true}}"#;

#[test]
fn a_patch_of_an_owner_rewrites_the_copies_of_its_dependents_in_its_tenant() {
    let d = shop();
    let other_tenant = ORDER.replace(r#""op""#, r#""tenant":"acme","op""#);
    let log = [CUSTOMER, ORDER, TICKET, &other_tenant, r#"{"op":"patch","kind":"customer","id":"c1","set":{"plan":"gold","name":"Ann Lee"}}"#].join("\n");
    let r = applied(&d, &log);
    assert_eq!(copy(&r, None, "order", "o1", "customer"), [("name".into(), s("Ann Lee")), ("plan".into(), s("gold"))]);
    assert_eq!(copy(&r, None, "ticket", "t1", "customer"), [("plan".into(), s("gold"))]);
    assert_eq!(copy(&r, Some("acme"), "order", "o1", "customer"), [], "acme has no customer c1");
    assert_eq!(doc(&r, None, "customer", "c1").unwrap().fields["since"], s("2026-01-02"), "a patch leaves the fields it does not name");
}

#[test]
fn a_dependent_written_before_its_owner_takes_the_copy_when_the_owner_is_written_and_keeps_it_after_its_delete() {
    let d = shop();
    let r = applied(&d, &[ORDER, CUSTOMER, r#"{"op":"delete","kind":"customer","id":"c1"}"#].join("\n"));
    assert_eq!(copy(&r, None, "order", "o1", "customer"), [("name".into(), s("Ann")), ("plan".into(), s("free"))]);
    assert!(doc(&r, None, "customer", "c1").is_none());
    let r = applied(&d, &[ORDER, r#"{"op":"patch","kind":"customer","id":"c9","set":{"plan":"gold"}}"#].join("\n"));
    assert!(doc(&r, None, "customer", "c9").is_none(), "a patch of no document does nothing");
    assert_eq!(copy(&r, None, "order", "o1", "customer"), []);
}

#[test]
fn a_rename_of_a_prefix_moves_the_documents_beneath_it_only() {
    let d = shop();
    let product = |id: &str, p: &str| format!(r#"{{"op":"upsert","kind":"product","id":"{id}","fields":{{"path":"{p}","title":"T","price":1,"stock":1,"tags":[]}}}}"#);
    let log = [
        product("p1", "/garden/tools/rake"),
        product("p2", "/garden/toolshed/door"),
        product("p3", "/garden/tools"),
        r#"{"op":"rename_prefix","kind":"product","from":"/garden/tools","to":"/garden/kit"}"#.into(),
    ]
    .join("\n");
    let r = applied(&d, &log);
    let path = |id: &str| doc(&r, None, "product", id).unwrap().fields["path"].clone();
    assert_eq!([path("p1"), path("p2"), path("p3")], [s("/garden/kit/rake"), s("/garden/toolshed/door"), s("/garden/kit")]);
}

/// A small deterministic generator (xorshift), so that a failure repeats.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }

    fn pick<'a>(&mut self, of: &[&'a str]) -> &'a str {
        of[self.below(of.len() as u64) as usize]
    }
}

/// A log of compiled-in commands of every kind, in two tenants, with
/// renames within and across top-level directories and owner changes.
fn legacy_log(rng: &mut Rng, n: usize) -> Vec<Envelope> {
    let st = |v: &str| v.to_string();
    let (files, dirs, users, posts, words) = (["f0", "f1", "f2", "f3"], ["/a/x", "/a/y", "/b/x", "/b"], ["u0", "u1", "u2"], ["p0", "p1", "p2", "p3"], ["alpha", "beta", "gamma"]);
    (0..n)
        .map(|_| {
            let command = match rng.below(8) {
                0 | 1 => Command::UpsertFile {
                    id: st(rng.pick(&files)),
                    path: format!("{}/{}.txt", rng.pick(&dirs), rng.pick(&words)),
                    contents: st(rng.pick(&words)),
                    previous_path: (rng.below(3) == 0).then(|| format!("{}/old.txt", rng.pick(&dirs))),
                },
                2 => Command::DeleteFile { id: st(rng.pick(&files)), path: st("/a/x/any.txt") },
                3 => Command::RenamePath { from: st(rng.pick(&dirs)), to: st(rng.pick(&["/a/z", "/b/y", "/c"])) },
                4 => Command::UpsertUser { id: st(rng.pick(&users)), name: st(rng.pick(&words)), email: st("e@x"), dob: st("2000-01-01") },
                5 => Command::UpsertPost {
                    id: st(rng.pick(&posts)),
                    user_id: st(rng.pick(&users)),
                    title: st(rng.pick(&words)),
                    body: st("b"),
                    previous_user_id: (rng.below(3) == 0).then(|| st(rng.pick(&users))),
                },
                6 => Command::DeletePost { id: st(rng.pick(&posts)), user_id: st(rng.pick(&users)) },
                _ => Command::DeleteUser { id: st(rng.pick(&users)) },
            };
            Envelope::new(command).of_tenant((rng.below(3) == 0).then_some("acme"))
        })
        .collect()
}

#[test]
fn the_files_and_posts_model_means_what_the_compiled_in_commands_mean() {
    let d = legacy::domain().clone();
    assert_eq!(d.name, legacy::MODEL);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for round in 0..200 {
        let log = legacy_log(&mut rng, 40);
        let (mut compiled_in, mut generic) = (crate::model::Model::default(), ModelReference::new(d.clone()));
        for e in &log {
            compiled_in.apply(&e.command);
            let m = legacy::to_model(e);
            // What a producer may send as a model command passes the
            // model's checks (renames across or of top-level directories
            // are moves, not yet model commands).
            if !matches!(&e.command, Command::RenamePath { from, to } if crate::command::path::top_level(from) != crate::command::path::top_level(to) || crate::command::path::depth(from) < 2) {
                m.validate(&d).unwrap_or_else(|err| panic!("round {round}: {e:?} as {m:?}: {err}"));
            }
            generic.apply(&m);
        }
        assert_eq!(legacy_docs::as_compiled_in(&generic), compiled_in.docs(), "round {round}: {log:#?}");
    }
}
