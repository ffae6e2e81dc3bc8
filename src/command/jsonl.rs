//! The JSONL bulk format: one command per line, `{"op": ..., fields...}`.
//! This format is a public contract (see the README).

use super::Command;

/// A line that could not be accepted, with its 1-based number.
#[derive(Debug, thiserror::Error)]
#[error("line {line}: {reason}")]
pub struct LineError {
    pub line: usize,
    pub reason: String,
}

/// Parses and validates one line. Blank lines yield `None`. A line may
/// name its tenant (`"tenant": "acme"`): its command is then scoped to it
/// (see [`super::tenant`]).
pub fn parse_line(line_no: usize, line: &str) -> Result<Option<Command>, LineError> {
    if line.trim().is_empty() {
        return Ok(None);
    }
    let err = |reason: String| LineError { line: line_no, reason };
    let mut fields: serde_json::Map<String, serde_json::Value> = serde_json::from_str(line).map_err(|e| err(e.to_string()))?;
    let tenant = match fields.remove("tenant") {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(t)) => Some(t),
        Some(other) => return Err(err(format!("tenant {other} is not a string"))),
    };
    let command: Command = serde_json::from_value(serde_json::Value::Object(fields)).map_err(|e| err(e.to_string()))?;
    command.validate().map_err(|e| err(e.to_string()))?;
    if let Some(t) = &tenant {
        super::tenant::validate(t).map_err(|e| err(e.to_string()))?;
    }
    let scoped = command.scoped(tenant.as_deref());
    // Scoped, an id is longer by its tenant's: checked here, at its line.
    scoped.validate_scoped().map_err(|e| err(e.to_string()))?;
    Ok(Some(scoped))
}

/// The JSONL line of a command (scoped or not): what [`parse_line`] reads
/// back as the same command.
pub fn line(command: &Command) -> String {
    let mut v = serde_json::to_value(command.unscoped()).expect("a command serializes");
    if let Some(t) = command.tenant() {
        v["tenant"] = serde_json::Value::String(t.to_string());
    }
    v.to_string()
}

/// Parses a whole input; on the first bad line returns its error, so that
/// nothing from a rejected input is produced.
pub fn parse_all(input: impl std::io::BufRead) -> Result<Vec<Command>, LineError> {
    parse_lines(input, parse_line)
}

/// Every line of `input` read by `parse` (given the 1-based line number),
/// stopping at the first error.
pub fn parse_lines<T>(input: impl std::io::BufRead, mut parse: impl FnMut(usize, &str) -> Result<Option<T>, LineError>) -> Result<Vec<T>, LineError> {
    let mut out = Vec::new();
    for (i, line) in input.lines().enumerate() {
        let line = line.map_err(|e| LineError { line: i + 1, reason: format!("cannot read: {e}") })?;
        out.extend(parse(i + 1, &line)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONTRACT: &str = r#"{"op":"upsert_file","id":"f1","path":"/clinton/projects/elasticsearch/README.txt","contents":"Starting a new Elasticsearch project is easy..."}
{"op":"delete_file","id":"f1","path":"/clinton/projects/elasticsearch/README.txt"}
{"op":"rename","from":"/clinton/projects","to":"/clinton/work"}
{"op":"rename","from":"/clinton/work","to":"/bill/work"}
{"op":"rename","from":"/bill","to":"/william"}
{"op":"upsert_user","id":"1","name":"John Smith","email":"john@smith.com","dob":"1970-10-24"}
{"op":"upsert_post","id":"2","user_id":"1","title":"Relationships","body":"It's complicated..."}
{"op":"delete_post","id":"2","user_id":"1"}
{"op":"upsert_file","id":"f2","path":"/bill/notes.txt","contents":"moved","previous_path":"/clinton/notes.txt"}
{"op":"upsert_post","id":"3","user_id":"1","title":"Moved","body":"now by 1","previous_user_id":"4"}
"#;

    #[test]
    fn parses_the_documented_contract() {
        let cmds = parse_all(CONTRACT.as_bytes()).unwrap();
        let kinds: Vec<_> = cmds.iter().map(Command::kind).collect();
        assert_eq!(kinds, ["upsert_file", "delete_file", "rename", "rename", "rename", "upsert_user", "upsert_post", "delete_post", "upsert_file", "upsert_post"]);
        assert_eq!(cmds[2], Command::RenamePath { from: "/clinton/projects".into(), to: "/clinton/work".into() });
        // Across top-level directories: the same format.
        assert_eq!(cmds[3].destination_key(), Some("/bill"));
        assert_eq!(cmds[4], Command::RenamePath { from: "/bill".into(), to: "/william".into() });
    }

    #[test]
    fn serialized_commands_parse_back() {
        for c in crate::demo::seed(50, 5, 20, 1) {
            let line = serde_json::to_string(&c).unwrap();
            assert_eq!(parse_line(1, &line).unwrap(), Some(c), "{line}");
        }
    }

    #[test]
    fn an_id_too_long_once_scoped_by_its_tenant_is_refused_at_its_line() {
        let id = "i".repeat(508);
        let line = format!(r#"{{"op":"upsert_user","id":"{id}","name":"n","email":"","dob":"1970-01-01","tenant":"acme"}}"#);
        let e = parse_line(7, &line).unwrap_err();
        assert_eq!(e.line, 7);
        assert!(e.reason.contains("with its tenant's scope"), "{}", e.reason);
        let plain = format!(r#"{{"op":"upsert_user","id":"{id}","name":"n","email":"","dob":"1970-01-01"}}"#);
        assert!(parse_line(7, &plain).unwrap().is_some(), "508 bytes is a valid id of the default tenant");
    }

    #[test]
    fn a_line_may_name_its_tenant() {
        let c = parse_line(1, r#"{"op":"rename","from":"/docs/a","to":"/docs/b","tenant":"acme"}"#).unwrap().unwrap();
        assert_eq!(c, Command::RenamePath { from: "/docs/a".into(), to: "/docs/b".into() }.scoped(Some("acme")));
        assert_eq!(c.key(), "acme\u{1f}/docs");
        assert_eq!(parse_line(1, &line(&c)).unwrap(), Some(c));
        let plain = parse_line(1, r#"{"op":"rename","from":"/docs/a","to":"/docs/b","tenant":null}"#).unwrap().unwrap();
        assert_eq!(plain.tenant(), None);
        for (bad, want) in [(r#""Acme""#, "a-z, 0-9"), ("7", "not a string"), (r#""""#, "is empty")] {
            let e = parse_line(1, &format!(r#"{{"op":"rename","from":"/docs/a","to":"/docs/b","tenant":{bad}}}"#)).unwrap_err();
            assert!(e.reason.contains(want), "{bad}: {}", e.reason);
        }
    }

    #[test]
    fn reports_line_numbers_and_reasons() {
        let cases = [
            ("{not json", "key must be a string"),
            (r#"{"op":"explode","id":"1"}"#, "unknown variant"),
            (r#"{"op":"delete_post","id":"2"}"#, "missing field `user_id`"),
            (r#"{"op":"delete_post","id":"2","user_id":"1","extra":1}"#, "unknown field"),
            (r#"{"op":"delete_file","id":"f","path":"a/b"}"#, "absolute"),
            (r#"{"op":"delete_file","id":"f","path":"/a//b"}"#, "empty segment"),
            (r#"{"op":"delete_file","id":"f","path":"/a/../b"}"#, "'..'"),
            (r#"{"op":"rename","from":"/a/b","to":"/a/b/c"}"#, "into itself"),
            (r#"{"op":"rename","from":"/a/b","to":"/c"}"#, "only a top-level directory can become one"),
            (r#"{"op":"upsert_file","id":"f","path":"/a/b","contents":"","previous_path":"/c"}"#, "previous_path \"/c\" must lie inside"),
            (r#"{"op":"upsert_file","id":"f","path":"/a/b","contents":"","previous_path":7}"#, "invalid type"),
            (r#"{"op":"upsert_post","id":"p","user_id":"1","title":"","body":"","previous_user_id":""}"#, "previous_user_id is empty"),
            (r#"{"op":"delete_file","id":"f","path":"/a/b","previous_path":"/c/d"}"#, "unknown field"),
        ];
        for (line, want) in cases {
            let input = format!("{}\n\n{line}\n", CONTRACT.lines().next().unwrap());
            let e = parse_all(input.as_bytes()).unwrap_err();
            assert_eq!(e.line, 3, "{line}");
            assert!(e.reason.contains(want), "{line}: {} does not mention {want}", e.reason);
        }
    }
}
