//! The model file's JSON Schema (`schemas/model.schema.json`, for editors)
//! against the reference JSON Schema implementation (python-jsonschema,
//! installed by scripts/install-interop.sh): it accepts the shipped models,
//! and refuses every malformed file that denorm's loader refuses for its
//! shape. What only the loader checks (references, keys, copies) is
//! listed apart: the schema accepts it, the loader refuses it.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use denorm::domain::Domain;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Each file's first schema error, or `None` where the schema accepts it.
fn schema_verdicts(files: &BTreeMap<String, String>) -> BTreeMap<String, Option<String>> {
    let root = std::env::var("DENORM_INTEROP").map(PathBuf::from).unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/denorm/interop"));
    let mut child = Command::new(root.join("py/bin/python"))
        .arg("tests/interop/python/check_model_schema.py")
        .current_dir(repo())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the interop venv's python (scripts/install-interop.sh)");
    child.stdin.take().unwrap().write_all(serde_json::to_string(files).unwrap().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "python-jsonschema failed (scripts/install-interop.sh installs it):\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

const BASE: &str = "name = \"m\"\nversion = 1\n[kinds.customer]\nkey = \"id\"\nfields.plan = \"keyword\"\n[kinds.order]\nkey = { owner = \"customer_id\" }\nfields.customer_id = { type = \"keyword\", ref = \"customer\" }\ncopies.customer = { via = \"customer_id\", fields = [\"plan\"] }\n";

#[test]
fn the_json_schema_accepts_the_shipped_models_and_refuses_malformed_ones_as_the_loader_does() {
    let mut files = BTreeMap::new();
    for shipped in ["files-and-posts.toml", "shop.toml"] {
        files.insert(shipped.to_string(), std::fs::read_to_string(repo().join("models").join(shipped)).unwrap());
    }
    files.insert("base".into(), BASE.into());
    files.insert("with earlier".into(), BASE.replacen("version = 1", "version = 2\nearlier = [\"m-v1.toml\"]", 1));
    let malformed: &[(&str, &str, &str)] = &[
        ("unknown type", "fields.plan = \"keyword\"", "fields.plan = \"keywrd\""),
        ("unknown option", "fields.plan = \"keyword\"", "fields.plan = { tyep = \"keyword\" }"),
        ("unknown analyzer", "fields.plan = \"keyword\"", "fields.plan = { type = \"text\", analyzer = \"french\" }"),
        ("reserved field", "fields.plan = \"keyword\"", "fields.id = \"keyword\""),
        ("not a name", "fields.plan = \"keyword\"", "fields.Plan = \"keyword\""),
        ("version 0", "version = 1", "version = 0"),
        ("model name", "name = \"m\"", "name = \"my shop\""),
        ("key as a field name", "key = \"id\"", "key = \"plan\""),
        ("key with both", "key = { owner = \"customer_id\" }", "key = { owner = \"customer_id\", path = \"p\" }"),
        ("empty copy", "fields = [\"plan\"]", "fields = []"),
        ("unknown kind option", "[kinds.order]\n", "[kinds.order]\nbroken = true\n"),
        ("no key", "key = \"id\"\n", ""),
        ("empty nested list", "[kinds.order]\n", "[kinds.order.nested.lines]\n[kinds.order]\n"),
        ("earlier not a list", "version = 1", "version = 2\nearlier = \"m-v1.toml\""),
    ];
    // Only the loader sees these: they need the other declarations.
    let semantic: &[(&str, &str, &str)] = &[
        ("ref to no kind", "ref = \"customer\"", "ref = \"client\""),
        ("copy of a missing field", "fields = [\"plan\"]", "fields = [\"email\"]"),
        ("owner key on a keyword", "key = { owner = \"customer_id\" }", "key = { owner = \"plan\" }"),
    ];
    for (name, from, to) in malformed.iter().chain(semantic) {
        let text = BASE.replacen(from, to, 1);
        assert_ne!(text, BASE, "{name}: {from:?} not in the base model");
        files.insert(name.to_string(), text);
    }
    let verdicts = schema_verdicts(&files);
    for shipped in ["files-and-posts.toml", "shop.toml", "base", "with earlier"] {
        assert_eq!(verdicts[shipped], None, "the schema refuses {shipped}");
        assert!(Domain::parse(shipped, &files[shipped]).is_ok());
    }
    for (name, ..) in malformed {
        assert!(verdicts[*name].is_some(), "the schema accepts the malformed model ({name}):\n{}", files[*name]);
        assert!(Domain::parse(name, &files[*name]).is_err(), "the loader accepts the malformed model ({name})");
    }
    for (name, ..) in semantic {
        assert_eq!(verdicts[*name], None, "{name}: the schema checks shape only");
        assert!(Domain::parse(name, &files[*name]).is_err(), "the loader accepts {name}");
    }
}

/// The schema's bounds are the loader's limits (`domain::limits`), and its
/// names of types and analyzers the loader's.
#[test]
fn the_json_schemas_bounds_and_names_are_the_loaders() {
    use denorm::domain::{limits, Analyzer, FieldType};
    let s: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(repo().join("schemas/model.schema.json")).unwrap()).unwrap();
    let d = &s["$defs"];
    let kind = &d["kind"]["properties"];
    let copy = &kind["copies"]["additionalProperties"]["properties"]["fields"];
    for (what, got, want) in [
        ("kinds", &s["properties"]["kinds"]["maxProperties"], limits::KINDS),
        ("fields", &d["fields"]["maxProperties"], limits::FIELDS),
        ("copies", &kind["copies"]["maxProperties"], limits::COPIES),
        ("copied fields", &copy["maxItems"], limits::COPIED_FIELDS),
        ("nested lists", &kind["nested"]["maxProperties"], limits::NESTED),
        ("earlier versions", &s["properties"]["earlier"]["maxItems"], limits::EARLIER),
    ] {
        assert_eq!(got.as_u64(), Some(want as u64), "the schema's bound on {what}");
    }
    assert_eq!(d["name"]["pattern"], format!("^[a-z][a-z0-9_]{{0,{}}}$", limits::NAME - 1));
    assert_eq!(d["fieldName"]["allOf"][1]["not"]["enum"], serde_json::json!(denorm::domain::RESERVED));
    let types: Vec<&str> = d["type"]["enum"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(types.join(", "), FieldType::NAMES.replace(" or ", ", "));
    let analyzers = &d["field"]["oneOf"][1]["properties"]["analyzer"]["enum"];
    assert_eq!(analyzers, &serde_json::json!(Analyzer::ALL.map(Analyzer::name)));
}
