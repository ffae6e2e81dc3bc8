use super::*;
use crate::command::generic::jsonl::parse_all;
use crate::command::LogPosition;

fn model(file: &str, text: &str) -> ModelCodec {
    ModelCodec::new(Domain::parse(file, text).unwrap())
}

fn shop() -> ModelCodec {
    model("shop.toml", include_str!("../../../models/shop.toml"))
}

#[test]
fn every_command_of_a_model_decodes_as_it_was_encoded() {
    let codec = shop();
    let mut commands = parse_all(codec.domain(), include_str!("../../../models/shop.jsonl").as_bytes()).unwrap();
    assert!(commands.len() >= 9);
    commands[1].after = Some(LogPosition { partition: 3, offset: 41 });
    commands[2].repair = Some(crate::command::Repair { unchanged_since: 7, seen: Some(true) });
    for e in &commands {
        let bytes = codec.encode(e);
        assert_eq!(&bytes[..2], &[0xC3, 0x01]);
        assert_eq!(hex(&bytes[2..10]), codec.fingerprint());
        assert_eq!(&codec.decode(&bytes).unwrap(), e);
    }
}

#[test]
fn the_schema_names_each_kinds_operations_in_the_models_namespace() {
    let codec = shop();
    let json: serde_json::Value = serde_json::from_str(codec.schema_text()).unwrap();
    assert_eq!(json["namespace"], "denorm.model.shop");
    let payload = json["fields"].as_array().unwrap().iter().find(|f| f["name"] == "payload").unwrap();
    let names: Vec<String> = payload["type"].as_array().unwrap().iter().map(|b| format!("{}.{}", b["namespace"].as_str().unwrap(), b["name"].as_str().unwrap())).collect();
    let expected: Vec<String> = [
        ("customer", "Upsert"),
        ("customer", "Patch"),
        ("customer", "Delete"),
        ("order", "Upsert"),
        ("order", "Patch"),
        ("order", "Delete"),
        ("product", "Upsert"),
        ("product", "Patch"),
        ("product", "Delete"),
        ("product", "RenamePrefix"),
        ("ticket", "Upsert"),
        ("ticket", "Patch"),
        ("ticket", "Delete"),
    ]
    .iter()
    .map(|(k, op)| format!("denorm.model.shop.{k}.{op}"))
    .collect();
    assert_eq!(names, expected);
    let envelope: Vec<&str> = json["fields"].as_array().unwrap().iter().map(|f| f["name"].as_str().unwrap()).collect();
    assert_eq!(envelope, ["command_id", "issued_at", "tenant", "after", "repair", "payload"]);
    // The shipped model of the compiled-in domain has a schema too.
    let files = model("files-and-posts.toml", include_str!("../../../models/files-and-posts.toml"));
    assert_ne!(files.fingerprint(), codec.fingerprint());
}

#[test]
fn what_the_schema_cannot_refuse_decodes_and_is_refused_by_the_model() {
    let codec = shop();
    let mut commands = parse_all(codec.domain(), r#"{"op":"delete","kind":"product","id":"p1","path":"/garden/p-1"}"#.as_bytes()).unwrap();
    let Op::Delete { at, .. } = &mut commands[0].command.op else { panic!("a delete") };
    *at = Some("garden/p-1".into());
    let decoded = codec.decode(&codec.encode(&commands[0])).unwrap();
    let refused = decoded.validate(codec.domain()).unwrap_err();
    assert_eq!(refused.field, "path");
}

#[test]
fn other_schemas_and_cut_messages_are_refused() {
    let codec = shop();
    let e = &parse_all(codec.domain(), include_str!("../../../models/shop.jsonl").as_bytes()).unwrap()[1];
    let bytes = codec.encode(e);
    let legacy = crate::codec::Codec::new().encode(&crate::command::Envelope::new(crate::command::Command::DeleteUser { id: "u".into() }));
    assert!(matches!(codec.decode(&legacy), Err(DecodeError::UnknownFingerprint(_))));
    assert!(matches!(codec.decode(&bytes[..bytes.len() - 3]), Err(DecodeError::Datum(_))));
    let mut longer = bytes.clone();
    longer.push(0);
    assert_eq!(codec.decode(&longer), Err(DecodeError::TrailingBytes(1)));
    assert!(matches!(codec.decode(&bytes[..6]), Err(DecodeError::TooShort(6))));
}

#[test]
fn a_command_of_an_earlier_version_is_read_with_its_schema_and_bound_to_the_model() {
    use crate::command::{Command, Envelope};
    let dir = tempfile::tempdir().unwrap();
    let v1 = include_str!("../../../models/shop.toml");
    std::fs::write(dir.path().join("shop.toml"), v1).unwrap();
    let v2 = crate::domain::tests::shop_v2(|t| t);
    std::fs::write(dir.path().join("shop-v2.toml"), v2).unwrap();
    let v2 = Domain::load(&dir.path().join("shop-v2.toml")).unwrap().interned();
    let old = shop();
    let written = &parse_all(old.domain(), include_str!("../../../models/shop.jsonl").as_bytes()).unwrap()[1];
    let bytes = old.encode(written);
    let Ok(Envelope { command: Command::Model(bound), .. }) = crate::codec::Codec::new().with_model(v2).decode(&bytes) else { panic!("not read as a command of the model") };
    assert!(std::ptr::eq(bound.domain, v2) && bound.validate().is_ok(), "{bound:?}");
    assert_eq!(bound.command, written.command);
    let without = Domain::parse("shop-v2.toml", &std::fs::read_to_string(dir.path().join("shop-v2.toml")).unwrap()).unwrap().interned();
    assert!(matches!(crate::codec::Codec::new().with_model(without).decode(&bytes), Err(DecodeError::UnknownFingerprint(_))));
}
