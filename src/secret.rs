//! Credentials (Elasticsearch's, the schema registry's) from environment
//! variables or files, never printed: [`Secret`] hides them from `Debug`
//! and `Display`.

/// A credential. Its value never appears in logs or debug output.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl std::fmt::Display for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

/// A secret from environment variable `value`, or from the file named by
/// `file` (its trailing newline dropped); `None` when neither is set.
pub fn read_secret(lookup: &impl Fn(&str) -> Option<String>, value: &str, file: &str) -> Result<Option<Secret>, String> {
    if let Some(v) = lookup(value) {
        return Ok(Some(Secret::new(v)));
    }
    match lookup(file) {
        Some(path) => std::fs::read_to_string(&path).map(|s| Some(Secret::new(s.trim_end_matches(['\n', '\r'])))).map_err(|e| format!("cannot read {file} ({path}): {e}")),
        None => Ok(None),
    }
}
