use std::path::Path;

use super::*;

fn shipped(name: &str) -> Domain {
    Domain::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("models").join(name)).unwrap_or_else(|e| panic!("{e}"))
}

/// The shop model shipped in `models/shop.toml`, which the unit tests of
/// every layer use.
pub(crate) fn shop() -> Domain {
    shipped("shop.toml")
}

#[test]
fn the_shipped_files_and_posts_model_declares_todays_domain() {
    let d = shipped("files-and-posts.toml");
    assert_eq!(d.kinds.iter().map(|k| k.name.as_str()).collect::<Vec<_>>(), ["file", "post", "user"]);
    let file = d.kind("file").unwrap();
    assert_eq!(file.key, OrderingKey::PathTop { field: "path".into() });
    assert_eq!(file.field("path").unwrap().ty, FieldType::Path);
    let post = d.kind("post").unwrap();
    assert_eq!(post.key, OrderingKey::Owner { field: "user_id".into(), owner: "user".into() });
    assert_eq!(post.copies, [OwnerCopy { name: "user".into(), via: "user_id".into(), owner: "user".into(), fields: vec!["name".into()] }]);
    assert_eq!(d.kind("user").unwrap().field("name").unwrap().ty, FieldType::Text { analyzer: Analyzer::Standard, exact: true });
}

#[test]
fn the_shipped_shop_model_has_nested_lines_two_dependents_and_a_category_tree() {
    let d = shipped("shop.toml");
    let order = d.kind("order").unwrap();
    assert_eq!(order.nested.len(), 1);
    assert_eq!(order.nested[0].fields.iter().map(|f| (f.name.as_str(), f.ty.name())).collect::<Vec<_>>(), [("price", "float"), ("quantity", "integer"), ("sku", "keyword")]);
    assert_eq!(order.copies[0].fields, ["name", "plan"]);
    assert!(order.field("note").unwrap().optional);
    assert_eq!(d.kind("ticket").unwrap().copies[0].fields, ["plan"]);
    assert_eq!(d.kind("product").unwrap().field("tags").unwrap().ty, FieldType::Keywords);
    assert_eq!(d.kind("ticket").unwrap().field("subject").unwrap().ty, FieldType::Text { analyzer: Analyzer::English, exact: false });
}

const SMALL: &str = r#"
name = "small"
version = 1
[kinds.customer]
key = "id"
fields.name = "text"
fields.plan = "keyword"
[kinds.order]
key = { owner = "customer_id" }
fields.customer_id = { type = "keyword", ref = "customer" }
copies.customer = { via = "customer_id", fields = ["plan", "name"] }
"#;

#[test]
fn the_fingerprint_ignores_how_the_file_is_written_and_tells_models_apart() {
    let a = Domain::parse("a.toml", SMALL).unwrap();
    // The same model: kinds in another order, a comment, a table instead of
    // a shorthand, the ref without its implied type.
    let b = Domain::parse(
        "b.toml",
        r#"
# the same, written otherwise
name = "small"
version = 1
[kinds.order]
key = { owner = "customer_id" }
fields.customer_id = { ref = "customer" }
copies.customer = { via = "customer_id", fields = ["plan", "name"] }
[kinds.customer]
key = "id"
fields.plan = { type = "keyword" }
fields.name = { type = "text", analyzer = "standard" }
"#,
    )
    .unwrap();
    assert_eq!(a, b);
    assert_eq!(a.fingerprint(), b.fingerprint());
    assert_eq!(a.fingerprint().len(), 32);
    // A copy's field order is what the documents carry: kept.
    let c = Domain::parse("c.toml", &SMALL.replace(r#"["plan", "name"]"#, r#"["name", "plan"]"#)).unwrap();
    assert_ne!(a.fingerprint(), c.fingerprint());
    for other in [
        SMALL.replace("version = 1", "version = 2"),
        SMALL.replace(r#"fields.plan = "keyword""#, r#"fields.plan = "text""#),
        SMALL.replace(r#"fields.name = "text""#, r#"fields.name = { type = "text", exact = true }"#),
    ] {
        assert_ne!(a.fingerprint(), Domain::parse("d.toml", &other).unwrap().fingerprint(), "{other}");
    }
}

/// A change of `SMALL` (the text replaced, the replacement), and the line,
/// field and words of the error it must give.
fn refused(from: &str, to: &str, line: usize, field: &str, words: &str) {
    let text = SMALL.replacen(from, to, 1);
    assert_ne!(text, SMALL, "{from:?} is not in the model");
    let e = Domain::parse("m.toml", &text).expect_err(&text);
    assert_eq!((e.line, e.field.as_str()), (line, field), "{e}");
    assert!(e.message.contains(words), "{e}\nhas not {words:?}");
    assert!(e.to_string().starts_with(&format!("m.toml:{line}:")), "{e}");
}

#[test]
fn a_bad_model_is_refused_with_its_line_and_field() {
    refused(r#"fields.plan = "keyword""#, r#"fields.plan = "keywrd""#, 7, "kinds.customer.fields.plan", "unknown type `keywrd`");
    refused(r#"fields.plan = "keyword""#, r#"fields.plan = { tyep = "keyword" }"#, 7, "", "unknown field `tyep`");
    refused(r#"fields.name = "text""#, r#"fields.name = { type = "text", analyzer = "french" }"#, 6, "kinds.customer.fields.name", "unknown analyzer `french`");
    refused(r#"fields.plan = "keyword""#, r#"fields.plan = { type = "keyword", analyzer = "english" }"#, 7, "kinds.customer.fields.plan", "`analyzer` is for text fields only");
    refused(r#"fields.plan = "keyword""#, r#"fields.id = "keyword""#, 7, "kinds.customer.fields.id", "reserved");
    refused(r#"fields.plan = "keyword""#, r#"fields.Plan = "keyword""#, 7, "kinds.customer.fields.Plan", "is not a name");
    refused(r#"ref = "customer""#, r#"ref = "client""#, 10, "kinds.order.fields.customer_id", "names no kind of this model (customer, order)");
    refused(r#"key = { owner = "customer_id" }"#, r#"key = { owner = "client_id" }"#, 9, "kinds.order.key", "`client_id` is not a field of this kind");
    refused(r#"key = { owner = "customer_id" }"#, r#"key = { path = "customer_id" }"#, 9, "kinds.order.key", "a path key names a path field");
    refused(r#"key = { owner = "customer_id" }"#, r#"key = "customer_id""#, 9, "kinds.order.key", "a key is \"id\"");
    refused(r#"key = { owner = "customer_id" }"#, r#"key = { owner = "customer_id", path = "p" }"#, 9, "kinds.order.key", "either `owner` or `path`");
    refused(r#"fields = ["plan", "name"]"#, r#"fields = ["plan", "email"]"#, 11, "kinds.order.copies.customer", "`email` is not a field of `customer` (name, plan)");
    refused(r#"fields = ["plan", "name"]"#, r#"fields = ["plan", "plan"]"#, 11, "kinds.order.copies.customer", "copied twice");
    refused(r#"fields = ["plan", "name"]"#, r#"fields = []"#, 11, "kinds.order.copies.customer", "a copy carries 1 to 32 fields");
    refused(r#"via = "customer_id""#, r#"via = "buyer_id""#, 11, "kinds.order.copies.customer", "not a field of this kind");
    refused(r#"{ type = "keyword", ref = "customer" }"#, r#"{ ref = "customer", exact = true }"#, 10, "kinds.order.fields.customer_id", "`exact` is for text fields only");
    refused(r#"version = 1"#, r#"version = 0"#, 3, "version", "starts at 1");
    refused(r#"name = "small""#, r#"name = "Small Shop""#, 2, "name", "is not a name");
    refused(
        r#"[kinds.order]"#,
        r#"[kinds.order]
broken = true"#,
        9,
        "",
        "unknown field `broken`",
    );
    refused(r#"version = 1"#, r#"version = "one""#, 3, "", "invalid type");
    refused(r#"key = "id""#, r#"key = [1]"#, 5, "", "\"id\", { owner");
}

#[test]
fn a_key_or_copy_the_model_cannot_keep_in_order_is_refused() {
    // The owner keyed by something else than its id: the dependents could
    // not share its key.
    refused(r#"key = "id""#, r#"key = { owner = "plan" }"#, 5, "kinds.customer.key", "a ref field");
    let chain = SMALL.replace(r#"[kinds.order]"#, "[kinds.line]\nkey = { owner = \"order_id\" }\nfields.order_id = { ref = \"order\" }\n[kinds.order]");
    let e = Domain::parse("m.toml", &chain).unwrap_err();
    assert_eq!((e.line, e.field.as_str()), (9, "kinds.line.key"), "{e}");
    assert!(e.message.contains("an owner must be keyed by its own id"), "{e}");
    // A copy through a ref that is not the ordering key: across keys.
    let across = SMALL.replace(r#"key = { owner = "customer_id" }"#, "key = \"id\"");
    let e = Domain::parse("m.toml", &across).unwrap_err();
    assert_eq!((e.line, e.field.as_str()), (11, "kinds.order.copies.customer"), "{e}");
    assert!(e.message.contains("copies across ordering keys are not supported yet"), "{e}");
    // An optional key.
    let optional = SMALL.replace(r#"{ type = "keyword", ref = "customer" }"#, r#"{ type = "keyword", ref = "customer", optional = true }"#);
    assert!(Domain::parse("m.toml", &optional).unwrap_err().message.contains("cannot be optional"));
}

#[test]
fn nested_objects_hold_values_only_and_names_do_not_collide() {
    let with = |extra: &str| SMALL.to_owned() + extra;
    let e = Domain::parse("m.toml", &with("[kinds.order.nested.lines]\nwhere = \"path\"\n")).unwrap_err();
    assert_eq!(e.field, "kinds.order.nested.lines.where", "{e}");
    assert!(e.message.contains("cannot be a path"), "{e}");
    let e = Domain::parse("m.toml", &with("[kinds.order.nested.customer_id]\nsku = \"keyword\"\n")).unwrap_err();
    assert!(e.message.contains("is a field of the kind already"), "{e}");
    let e = Domain::parse("m.toml", &with("[kinds.order.nested.lines]\n")).unwrap_err();
    assert!(e.message.contains("at least one field"), "{e}");
    let e = Domain::parse("m.toml", &SMALL.replace("copies.customer", "copies.customer_id")).unwrap_err();
    assert!(e.message.contains("names a field or a nested list"), "{e}");
    assert!(Domain::parse("m.toml", &with("[kinds.order.nested.lines]\nsku = \"keyword\"\nqty = \"integer\"\n")).is_ok());
}

#[test]
fn limits_are_kept() {
    let many: String = (0..=limits::FIELDS).map(|i| format!("fields.f{i} = \"keyword\"\n")).collect();
    let e = Domain::parse("m.toml", &SMALL.replace("fields.plan = \"keyword\"\n", &many)).unwrap_err();
    assert!(e.message.contains("130 fields; at most 128"), "{e}");
    assert_eq!((e.line, e.field.as_str()), (4, "kinds.customer.fields"), "{e}");
    let kinds: String = (0..limits::KINDS).map(|i| format!("[kinds.k{i}]\nkey = \"id\"\n")).collect();
    let e = Domain::parse("m.toml", &(SMALL.to_owned() + &kinds)).unwrap_err();
    assert!(e.message.contains("66 kinds; a model has at most 64"), "{e}");
    let long = "n".repeat(limits::NAME + 1);
    assert!(Domain::parse("m.toml", &SMALL.replace("fields.plan", &format!("fields.{long}"))).unwrap_err().message.contains("at most 64 characters"));
    assert!(Domain::parse("m.toml", "name = \"x\"\nversion = 1\n").unwrap_err().message.contains("at least one kind"));
    let two = SMALL.replace("fields.plan = \"keyword\"", "fields.home = \"path\"\nfields.work = \"path\"");
    let e = Domain::parse("m.toml", &two).unwrap_err();
    assert_eq!((e.line, e.field.as_str()), (8, "kinds.customer.fields.work"), "{e}");
    assert!(e.message.contains("at most one path field"), "{e}");
}

#[test]
fn an_unreadable_file_is_named() {
    let e = Domain::load(Path::new("/nonexistent/shop.toml")).unwrap_err();
    assert_eq!(e.to_string().split(": ").next(), Some("/nonexistent/shop.toml"));
    assert!(e.message.contains("cannot read the model file"), "{e}");
}

/// Version 2 of the shop model (`tests/fixtures/shop-v2.toml`), naming
/// version 1 (`shop.toml` in the same directory) as earlier; `change`
/// edits its text.
pub(crate) fn shop_v2(change: impl Fn(String) -> String) -> String {
    let v2 = include_str!("../../tests/fixtures/shop-v2.toml").replacen("earlier = [\"../../models/shop.toml\"]", "earlier = [\"shop.toml\"]", 1);
    change(v2)
}

fn load_v2(dir: &Path, text: &str) -> Result<Domain, ModelError> {
    std::fs::write(dir.join("shop.toml"), include_str!("../../models/shop.toml")).unwrap();
    std::fs::write(dir.join("shop-v2.toml"), text).unwrap();
    Domain::load(&dir.join("shop-v2.toml"))
}

#[test]
fn a_model_loads_the_earlier_versions_it_names_beside_it() {
    let dir = tempfile::tempdir().unwrap();
    let v2 = load_v2(dir.path(), &shop_v2(|t| t)).unwrap();
    let v1 = shipped("shop.toml");
    assert_eq!(v2.earlier.iter().map(Domain::fingerprint).collect::<Vec<_>>(), [v1.fingerprint()]);
    assert_eq!(v2, Domain::parse("v2", &shop_v2(|t| t)).unwrap(), "earlier versions are not part of what a model declares");
    assert!(Domain::parse("v2", &shop_v2(|t| t)).unwrap().earlier.is_empty(), "parse loads no file");
    // Version 3 names version 2 only, and reads version 1 through it.
    let v3 = shop_v2(|t| t).replace("version = 2\nearlier = [\"shop.toml\"]", "version = 3\nearlier = [\"shop-v2.toml\"]");
    std::fs::write(dir.path().join("shop-v3.toml"), v3).unwrap();
    let v3 = Domain::load(&dir.path().join("shop-v3.toml")).unwrap();
    assert_eq!(v3.earlier.iter().map(|d| d.version).collect::<Vec<_>>(), [2, 1]);
}

#[test]
fn an_earlier_version_whose_commands_would_not_read_as_this_ones_is_refused_naming_why() {
    let dir = tempfile::tempdir().unwrap();
    for (change, why) in [
        (
            &(|t: String| t.replace("fields.channel = { type = \"keyword\", optional = true }", "fields.channel = \"keyword\"")) as &dyn Fn(String) -> String,
            "kinds.order.fields.channel is required here, but upserts of version 1 may lack it",
        ),
        (&|t: String| t.replace("fields.total = \"float\"", "fields.total = \"integer\""), "kinds.order.fields.total is of type float in version 1 and integer here"),
        (&|t: String| t.replace("fields.note = { type = \"text\", optional = true }\n", ""), "version 1 declares kinds.order.fields.note, which this version does not"),
        (&|t: String| t.replace("version = 2", "version = 1"), "an earlier version is version 1, not below this one's 1"),
        (&|t: String| t.replacen("name = \"shop\"", "name = \"store\"", 1), "an earlier version is of model shop, not store"),
        (&|t: String| t.replace("[kinds.order.nested.lines]", "[kinds.order.nested.items]"), "version 1 declares kinds.order.nested.lines"),
    ] {
        let text = change(shop_v2(|t| t));
        let earlier = text.lines().position(|l| l.starts_with("earlier =")).unwrap() + 1;
        let e = load_v2(dir.path(), &text).unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (earlier, "earlier"), "the line of `earlier`: {e}");
        assert!(e.message.contains(why), "{e}");
    }
    let e = load_v2(dir.path(), &shop_v2(|t| t.replace("earlier = [\"shop.toml\"]", "earlier = [\"shop-v0.toml\"]"))).unwrap_err();
    assert!(e.to_string().contains("shop-v0.toml") && e.to_string().contains("cannot read"), "{e}");
}
