use super::jsonl::{line, parse_all, parse_line};
use super::*;
use crate::domain::Domain;

fn shop() -> Domain {
    crate::domain::tests::shop()
}

/// One line of each operation, of kinds keyed each way.
const SHOP: &str = include_str!("../../../models/shop.jsonl");

#[test]
fn a_models_commands_parse_and_write_back_as_the_same_lines() {
    let d = shop();
    let commands = parse_all(&d, SHOP.as_bytes()).unwrap();
    assert_eq!(commands.len(), 9);
    for (e, text) in commands.iter().zip(SHOP.lines()) {
        let again = parse_line(&d, 1, &line(&d, e)).unwrap().unwrap();
        assert_eq!(again.command, e.command, "{text}");
        assert_eq!(again.tenant, e.tenant);
    }
    assert_eq!(commands[5].tenant.as_deref(), Some("acme"));
    let Op::Upsert { fields, .. } = &commands[1].command.op else { panic!("an upsert") };
    assert_eq!(fields["total"], Value::Float(9.0), "an integer is read as a float field's value");
    assert_eq!(fields["lines"], Value::Objects(vec![Object::from([("sku".into(), Value::Str("a-1".into())), ("quantity".into(), Value::Int(2)), ("price".into(), Value::Float(4.5))])]));
}

#[test]
fn each_kind_is_keyed_as_its_model_declares() {
    let d = shop();
    let commands = parse_all(&d, SHOP.as_bytes()).unwrap();
    let keys: Vec<&str> = commands.iter().map(|e| e.command.key(d.kind(&e.command.kind).unwrap())).collect();
    assert_eq!(keys, ["c1", "c1", "c1", "c1", "c2", "c2", "/garden", "/garden", "c1"]);
}

#[test]
fn an_owner_change_is_the_delete_under_the_key_it_leaves_then_the_upsert() {
    let d = shop();
    let commands = parse_all(&d, SHOP.as_bytes()).unwrap();
    let order = d.kind("order").unwrap();
    let change = &commands[4].command;
    assert_eq!(change.previous_key(order), Some("c1"));
    assert_eq!(change.owner_change_delete(order), Some(ModelCommand { kind: "order".into(), op: Op::Delete { id: "o1".into(), at: Some("c1".into()) } }));
    assert_eq!(commands[1].command.previous_key(order), None);

    let product = d.kind("product").unwrap();
    let within_its_top =
        parse_line(&d, 1, r#"{"op":"upsert","kind":"product","id":"p7","previous_path":"/garden/p-7","fields":{"path":"/garden/tools/p-7","title":"Rake","price":1,"stock":1,"tags":[]}}"#)
            .unwrap()
            .unwrap();
    assert_eq!(within_its_top.command.previous_key(product), None, "the same top segment is the same key");
    let across = parse_line(&d, 1, r#"{"op":"upsert","kind":"product","id":"p7","previous_path":"/yard/p-7","fields":{"path":"/garden/tools/p-7","title":"Rake","price":1,"stock":1,"tags":[]}}"#)
        .unwrap()
        .unwrap();
    assert_eq!(across.command.previous_key(product), Some("/yard"));
}

#[test]
fn commands_that_do_not_fit_the_model_are_refused_with_the_field_at_fault() {
    let d = shop();
    let refused = |line: &str| parse_line(&d, 7, line).unwrap_err().to_string();
    let cases = [
        (r#"{"op":"upsert","kind":"invoice","id":"i1","fields":{}}"#, "kind \"invoice\" is not a kind of model shop"),
        (r#"{"op":"upsert","kind":"customer","id":"c1","fields":{"name":"A","plan":"p","since":"2026-01-02","age":3}}"#, "fields.age is not a field of the kind"),
        (r#"{"op":"upsert","kind":"customer","id":"c1","fields":{"name":"A","since":"2026-01-02"}}"#, "fields.plan is required"),
        (r#"{"op":"upsert","kind":"customer","id":"c1","fields":{"name":"A","plan":"p","since":"2026-02-30"}}"#, "fields.since \"2026-02-30\" is not a day of the calendar"),
        (r#"{"op":"upsert","kind":"order","id":"o1","fields":{"customer_id":"c1","placed":"2026-12-04","status":"s","total":"9"}}"#, "fields.total is not a JSON value of a float field"),
        (
            r#"{"op":"upsert","kind":"order","id":"o1","fields":{"customer_id":"c1","placed":"2026-12-04","status":"s","total":1,"lines":[{"sku":"a","quantity":1,"price":1},{"skux":"b"}]}}"#,
            "fields.lines[1].skux is not a field of the kind",
        ),
        (
            r#"{"op":"upsert","kind":"order","id":"o1","fields":{"customer_id":"c1","placed":"2026-12-04","status":"s","total":1,"lines":[{"sku":"a","price":1}]}}"#,
            "fields.lines[0].quantity is required",
        ),
        (r#"{"op":"upsert","kind":"customer","id":"c1","previous_id":"c0","fields":{"name":"A","plan":"p","since":"2026-01-02"}}"#, "previous_id is not a field of upsert commands of customer"),
        (r#"{"op":"patch","kind":"order","id":"o1","customer_id":"c1","set":{}}"#, "set is empty"),
        (r#"{"op":"patch","kind":"order","id":"o1","customer_id":"c1","set":{"customer_id":"c2"}}"#, "set.customer_id is the ordering key of order"),
        (r#"{"op":"patch","kind":"order","id":"o1","set":{"status":"x"}}"#, "customer_id is required: it is the ordering key of order"),
        (r#"{"op":"delete","kind":"product","id":"p1","path":"/garden"}"#, "path \"/garden\" must lie below a top segment"),
        (r#"{"op":"rename_prefix","kind":"product","from":"/garden/tools","to":"/yard/tools"}"#, "is under another top segment"),
        (r#"{"op":"rename_prefix","kind":"product","from":"/garden/tools","to":"/garden/tools/old"}"#, "a prefix is not renamed into itself"),
        (r#"{"op":"rename_prefix","kind":"order","from":"/a/b","to":"/a/c"}"#, "order is not keyed by a path"),
        (r#"{"op":"upsert","kind":"product","id":"p7","fields":{"path":"garden/p-7","title":"R","price":1,"stock":1,"tags":[]}}"#, "fields.path \"garden/p-7\" must be absolute"),
        (r#"{"op":"delete","kind":"customer","id":"c1","tenant":"Acme"}"#, "tenant"),
        (r#"{"op":"merge","kind":"customer","id":"c1"}"#, "op \"merge\" is not upsert, patch, delete or rename_prefix"),
        (r#"{"op":"delete","kind":"customer","id":""}"#, "id is empty"),
    ];
    for (line, expected) in cases {
        let got = refused(line);
        assert!(got.starts_with("line 7: ") && got.contains(expected), "{line}\n  refused with: {got}\n  expected: {expected}");
    }
}
