//! The Avro schema of a model's commands (`denorm schema --model M`): the
//! envelope of `schemas/command.avsc` (its id, time, tenant, `after` and
//! `repair`), with a payload union of each kind's operations. Every name
//! is the model's own (`denorm.model.<model>.<kind>.Upsert`), so that two
//! models' schemas never share a record, and the schema is a plain Avro
//! schema that a schema registry and any Avro library take.

use serde_json::{json, Value as Json};

use crate::domain::{Domain, Field, FieldType, Kind, OrderingKey};

/// An operation's record in the payload union, in union order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Branch {
    Upsert,
    Patch,
    Delete,
    RenamePrefix,
}

/// A kind's operations, in the order of their branches.
pub(super) fn branches(kind: &Kind) -> &'static [Branch] {
    match kind.key {
        OrderingKey::PathTop { .. } => &[Branch::Upsert, Branch::Patch, Branch::Delete, Branch::RenamePrefix],
        _ => &[Branch::Upsert, Branch::Patch, Branch::Delete],
    }
}

/// The namespace of a kind's records.
pub(super) fn namespace(d: &Domain, kind: &Kind) -> String {
    format!("denorm.model.{}.{}", d.name, kind.name)
}

/// The schema, as JSON.
pub fn schema(d: &Domain) -> Json {
    let envelope: Json = serde_json::from_str(super::super::CURRENT_SCHEMA).expect("schemas/command.avsc is JSON");
    let mut fields: Vec<Json> = envelope["fields"].as_array().expect("the envelope has fields").iter().filter(|f| f["name"] != "payload").cloned().collect();
    for f in &mut fields {
        // The envelope's own words name the compiled-in commands; these
        // are a model's.
        let doc = match f["name"].as_str() {
            Some("tenant") => "The tenant (docs/tenants.md); null: the default tenant.",
            Some("after") => "Set on the upsert of an owner change (previous_<key field>): the partition and offset of its delete half under the key the document leaves, as the producer's delivery report gave them. A worker applies the upsert once that partition has been applied up to there. See docs/cross-key.md.",
            Some("repair") => "Set on a repair sent by `denorm verify --repair`: the command restores one document to its state in the replay of the log. See docs/verify.md.",
            _ => continue,
        };
        f["doc"] = doc.into();
    }
    let payload: Vec<Json> = d.kinds.iter().flat_map(|k| branches(k).iter().map(move |b| branch(d, k, *b))).collect();
    fields.push(json!({ "name": "payload", "type": payload }));
    json!({
        "type": "record",
        "name": "Command",
        "namespace": format!("denorm.model.{}", d.name),
        "doc": format!("A command of model {} version {} (fingerprint {}), written by `denorm schema --model`. Wire format: Avro single-object encoding (C3 01, CRC-64-AVRO fingerprint little-endian, binary datum), or a schema registry's framing.", d.name, d.version, d.fingerprint()),
        "fields": fields,
    })
}

/// A schema as indented JSON text, each object's members in the order a
/// reader expects (`name`, `type`, ... `fields` last) rather than
/// alphabetical.
pub fn to_text(j: &Json) -> String {
    let mut out = String::new();
    write(j, 0, &mut out);
    out.push('\n');
    out
}

fn write(j: &Json, depth: usize, out: &mut String) {
    const ORDER: [&str; 8] = ["name", "type", "namespace", "logicalType", "items", "default", "doc", "fields"];
    let indent = |d: usize| "  ".repeat(d);
    match j {
        Json::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort_by_key(|k| ORDER.iter().position(|o| o == k).unwrap_or(ORDER.len()));
            out.push_str("{\n");
            for (i, k) in keys.iter().enumerate() {
                out.push_str(&format!("{}{}: ", indent(depth + 1), Json::String(k.to_string())));
                write(&m[k.as_str()], depth + 1, out);
                out.push_str(if i + 1 < keys.len() { ",\n" } else { "\n" });
            }
            out.push_str(&format!("{}}}", indent(depth)));
        }
        Json::Array(items) if items.iter().any(|i| i.is_object() || i.is_array()) => {
            out.push_str("[\n");
            for (i, item) in items.iter().enumerate() {
                out.push_str(&indent(depth + 1));
                write(item, depth + 1, out);
                out.push_str(if i + 1 < items.len() { ",\n" } else { "\n" });
            }
            out.push_str(&format!("{}]", indent(depth)));
        }
        other => out.push_str(&other.to_string()),
    }
}

fn branch(d: &Domain, kind: &Kind, b: Branch) -> Json {
    let ns = namespace(d, kind);
    let key = kind.key_field();
    let id = json!({ "name": "id", "type": "string" });
    let key_value = |doc: &str| key.map(|f| json!({ "name": f, "type": "string", "doc": doc }));
    let (name, doc, fields): (&str, String, Vec<Json>) = match b {
        Branch::Upsert => {
            let previous = key.map(|f| json!({ "name": format!("previous_{f}"), "type": ["null", "string"], "default": null, "doc": format!("Set when the document changes owner with this upsert: its {f} until now. Send its delete there first (docs/cross-key.md).") }));
            let mut document: Vec<Json> = kind.fields.iter().map(|f| field(f, false)).collect();
            document.extend(kind.nested.iter().map(|n| {
                let item = json!({ "type": "record", "name": "Item", "namespace": format!("{ns}.{}", n.name), "fields": n.fields.iter().map(|f| field(f, false)).collect::<Vec<_>>() });
                json!({ "name": n.name, "type": { "type": "array", "items": item }, "default": [] })
            }));
            let document = json!({ "name": "fields", "type": { "type": "record", "name": "Fields", "fields": document } });
            ("Upsert", format!("Create or replace a document of kind {}{}.", kind.name, copies_doc(kind)), [Some(id), previous, Some(document)].into_iter().flatten().collect())
        }
        Branch::Patch => {
            let mut set: Vec<Json> = kind.fields.iter().filter(|f| Some(f.name.as_str()) != key).map(|f| field(f, true)).collect();
            set.extend(kind.nested.iter().map(|n| json!({ "name": n.name, "type": ["null", { "type": "array", "items": format!("{ns}.{}.Item", n.name) }], "default": null })));
            let set = json!({ "name": "set", "type": { "type": "record", "name": "Changes", "fields": set }, "doc": "The fields set (null: left as they are)." });
            (
                "Patch",
                format!("Set some fields of a document of kind {}, leaving the others; a patch of fields that dependents copy rewrites their copies.", kind.name),
                [Some(id), key_value("The document's: its ordering key, which a patch cannot change."), Some(set)].into_iter().flatten().collect(),
            )
        }
        Branch::Delete => ("Delete", format!("Delete a document of kind {}.", kind.name), [Some(id), key_value("The document's: its ordering key.")].into_iter().flatten().collect()),
        Branch::RenamePrefix => (
            "RenamePrefix",
            format!("Rename a prefix of the path of every document of kind {} beneath it, within one top segment.", kind.name),
            vec![json!({ "name": "from", "type": "string" }), json!({ "name": "to", "type": "string" })],
        ),
    };
    let key_doc = match &kind.key {
        OrderingKey::Id => "the id".to_string(),
        OrderingKey::Owner { field, .. } => format!("the {field}"),
        OrderingKey::PathTop { field } => format!("the top segment of {field}"),
    };
    json!({ "type": "record", "name": name, "namespace": ns, "doc": format!("{doc} Kafka key: {key_doc}."), "fields": fields })
}

/// What a kind's upsert copies from its owners, for its doc.
fn copies_doc(kind: &Kind) -> String {
    kind.copies.iter().map(|c| format!(", copying {} of its {}", c.fields.join(" and "), c.owner)).collect()
}

/// A field's declaration; `patch`: as a patch's, which may leave it out.
fn field(f: &Field, patch: bool) -> Json {
    let ty = match f.ty {
        FieldType::Integer => json!("long"),
        FieldType::Float => json!("double"),
        FieldType::Boolean => json!("boolean"),
        FieldType::Keywords => json!({ "type": "array", "items": "string" }),
        FieldType::Keyword | FieldType::Ref { .. } | FieldType::Text { .. } | FieldType::Date | FieldType::Path => json!("string"),
    };
    if patch || f.optional {
        json!({ "name": f.name, "type": ["null", ty], "default": null })
    } else {
        json!({ "name": f.name, "type": ty })
    }
}
