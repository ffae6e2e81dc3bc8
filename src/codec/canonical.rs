//! Avro's Parsing Canonical Form and the CRC-64-AVRO fingerprint, written
//! from the specification ("Parsing Canonical Form for Schemas" and "Schema
//! Fingerprints"), so denorm's fingerprints equal those of Java, fastavro,
//! avsc and every other conforming implementation.
//!
//! apache-avro's own canonical form keeps a logical-type primitive as
//! `{"type":{"type":"long"}}` where the specification (and every other
//! implementation) writes `"long"`; its fingerprints are kept only as
//! aliases for messages that earlier denorm builds wrote (see
//! [`super::Codec`]).

use serde_json::{Map, Value};

const PRIMITIVES: &[&str] = &["null", "boolean", "int", "long", "float", "double", "bytes", "string"];

/// The Parsing Canonical Form of the schema in `json`.
pub fn parsing_canonical_form(json: &str) -> Result<String, String> {
    let v: Value = serde_json::from_str(json).map_err(|e| format!("schema is not JSON: {e}"))?;
    let mut out = String::with_capacity(json.len());
    let mut defined = Vec::new();
    write(&v, "", &mut defined, &mut out)?;
    Ok(out)
}

/// CRC-64-AVRO (Rabin) fingerprint of `bytes`, as the specification's
/// reference implementation computes it.
pub fn crc64_avro(bytes: &[u8]) -> u64 {
    const EMPTY: u64 = 0xc15d_213a_a4d7_a795;
    static TABLE: std::sync::OnceLock<[u64; 256]> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut t = [0u64; 256];
        for (i, slot) in t.iter_mut().enumerate() {
            let mut fp = i as u64;
            for _ in 0..8 {
                fp = (fp >> 1) ^ (EMPTY & (fp & 1).wrapping_neg());
            }
            *slot = fp;
        }
        t
    });
    let mut fp = EMPTY;
    for &b in bytes {
        fp = (fp >> 8) ^ table[((fp ^ b as u64) & 0xff) as usize];
    }
    fp
}

/// The fingerprint of `json`'s canonical form, little-endian: the 8 bytes
/// that follow `C3 01` in a single-object-encoded message.
pub fn fingerprint(json: &str) -> Result<[u8; 8], String> {
    Ok(crc64_avro(parsing_canonical_form(json)?.as_bytes()).to_le_bytes())
}

/// [FULLNAMES]: `name` qualified by its own dots, its `namespace`, or the
/// enclosing one.
fn full_name(name: &str, namespace: Option<&str>, enclosing: &str) -> String {
    if name.contains('.') {
        return name.to_string();
    }
    match namespace.unwrap_or(enclosing) {
        "" => name.to_string(),
        ns => format!("{ns}.{name}"),
    }
}

fn write(v: &Value, ns: &str, defined: &mut Vec<String>, out: &mut String) -> Result<(), String> {
    match v {
        Value::String(s) => {
            // A primitive, or a reference to a named type defined before.
            let name = if PRIMITIVES.contains(&s.as_str()) { s.clone() } else { full_name(s, None, ns) };
            string(&name, out);
            Ok(())
        }
        Value::Array(branches) => {
            out.push('[');
            for (i, b) in branches.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write(b, ns, defined, out)?;
            }
            out.push(']');
            Ok(())
        }
        Value::Object(o) => object(o, ns, defined, out),
        other => Err(format!("{other} is not a schema")),
    }
}

fn object(o: &Map<String, Value>, ns: &str, defined: &mut Vec<String>, out: &mut String) -> Result<(), String> {
    let ty = o.get("type").ok_or("a schema object has no \"type\"")?;
    let ty_name = match ty {
        // {"type": {...}} or {"type": [...]}: the attributes around it do
        // not matter for parsing.
        Value::Object(_) | Value::Array(_) => return write(ty, ns, defined, out),
        Value::String(s) => s.as_str(),
        other => return Err(format!("\"type\" {other} is not a name")),
    };
    match ty_name {
        // [PRIMITIVES]: {"type":"long","logicalType":...} -> "long".
        p if PRIMITIVES.contains(&p) => {
            string(p, out);
            Ok(())
        }
        "record" | "error" | "enum" | "fixed" => {
            let name = o.get("name").and_then(Value::as_str).ok_or_else(|| format!("a {ty_name} has no name"))?;
            let full = full_name(name, o.get("namespace").and_then(Value::as_str), ns);
            if defined.contains(&full) {
                string(&full, out);
                return Ok(());
            }
            defined.push(full.clone());
            // The namespace of nested definitions: the one of this name.
            let inner = full.rsplit_once('.').map(|(n, _)| n.to_string()).unwrap_or_default();
            out.push_str("{\"name\":");
            string(&full, out);
            out.push_str(",\"type\":");
            string(if ty_name == "error" { "record" } else { ty_name }, out);
            match ty_name {
                "enum" => {
                    out.push_str(",\"symbols\":");
                    let symbols = o.get("symbols").and_then(Value::as_array).ok_or("an enum has no symbols")?;
                    write_strings(symbols, out)?;
                }
                "fixed" => {
                    let size = o.get("size").and_then(Value::as_u64).ok_or("a fixed has no size")?;
                    out.push_str(&format!(",\"size\":{size}"));
                }
                _ => {
                    out.push_str(",\"fields\":[");
                    let fields = o.get("fields").and_then(Value::as_array).ok_or("a record has no fields")?;
                    for (i, f) in fields.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        let fname = f.get("name").and_then(Value::as_str).ok_or("a field has no name")?;
                        out.push_str("{\"name\":");
                        string(fname, out);
                        out.push_str(",\"type\":");
                        write(f.get("type").ok_or("a field has no type")?, &inner, defined, out)?;
                        out.push('}');
                    }
                    out.push(']');
                }
            }
            out.push('}');
            Ok(())
        }
        "array" => {
            out.push_str("{\"type\":\"array\",\"items\":");
            write(o.get("items").ok_or("an array has no items")?, ns, defined, out)?;
            out.push('}');
            Ok(())
        }
        "map" => {
            out.push_str("{\"type\":\"map\",\"values\":");
            write(o.get("values").ok_or("a map has no values")?, ns, defined, out)?;
            out.push('}');
            Ok(())
        }
        // A reference to a named type, written as an object.
        name => {
            string(&full_name(name, None, ns), out);
            Ok(())
        }
    }
}

fn write_strings(items: &[Value], out: &mut String) -> Result<(), String> {
    out.push('[');
    for (i, s) in items.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        string(s.as_str().ok_or("a symbol is not a string")?, out);
    }
    out.push(']');
    Ok(())
}

/// [STRINGS]: a JSON string with UTF-8 as it is (only what JSON requires
/// is escaped).
fn string(s: &str, out: &mut String) {
    out.push_str(&Value::String(s.to_string()).to_string());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc64_avro_matches_the_specification_test_vectors() {
        // From the Avro project's shared test data (share/test/data/schema-tests.txt).
        assert_eq!(crc64_avro(b"\"int\""), 0x7275d51a3f395c8f);
        assert_eq!(crc64_avro(b"\"null\""), 0x63dd24e7cc258f8a);
        assert_eq!(crc64_avro(b"\"string\""), 0x8f014872634503c7);
    }

    #[test]
    fn canonical_form_follows_the_transformation_rules() {
        let pcf = |s: &str| parsing_canonical_form(s).unwrap();
        // PRIMITIVES, logical types included.
        assert_eq!(pcf(r#"{"type":"long","logicalType":"timestamp-millis"}"#), r#""long""#);
        // FULLNAMES, STRIP, ORDER, WHITESPACE.
        assert_eq!(
            pcf(r#"{"namespace":"x.y","doc":"d","type":"record","name":"R","aliases":["Q"],"fields":[
                {"doc":"f","type":{"type":"enum","name":"E","symbols":["A","B"]},"name":"e","default":"A"},
                {"name":"g","type":["null","E",{"type":"fixed","name":"z.F","size":16}]},
                {"name":"m","type":{"type":"map","values":{"type":"array","items":"int"}}}]}"#),
            r#"{"name":"x.y.R","type":"record","fields":[{"name":"e","type":{"name":"x.y.E","type":"enum","symbols":["A","B"]}},{"name":"g","type":["null","x.y.E",{"name":"z.F","type":"fixed","size":16}]},{"name":"m","type":{"type":"map","values":{"type":"array","items":"int"}}}]}"#
        );
        // Nested definitions inherit the namespace of the enclosing name.
        assert_eq!(
            pcf(r#"{"type":"record","name":"a.b.Outer","fields":[{"name":"i","type":{"type":"record","name":"Inner","fields":[]}},{"name":"j","type":"Inner"}]}"#),
            r#"{"name":"a.b.Outer","type":"record","fields":[{"name":"i","type":{"name":"a.b.Inner","type":"record","fields":[]}},{"name":"j","type":"a.b.Inner"}]}"#
        );
        // STRINGS: escapes become UTF-8.
        assert_eq!(pcf(r#"{"type":"enum","name":"\u00e9","symbols":["x"]}"#), "{\"name\":\"é\",\"type\":\"enum\",\"symbols\":[\"x\"]}");
    }

    #[test]
    fn rejects_what_is_not_a_schema() {
        assert!(parsing_canonical_form("{").is_err());
        assert!(parsing_canonical_form("{\"name\":\"x\"}").is_err());
        assert!(parsing_canonical_form("{\"type\":\"record\",\"fields\":[]}").is_err());
    }
}
