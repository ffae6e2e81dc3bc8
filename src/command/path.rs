//! Absolute slash-separated paths: validation, top-level directory (the
//! ordering key of filesystem commands), ancestors (`path.tree`) and renames.
//!
//! A tenant's paths are scoped (`acme\u{1f}/docs/a.txt`, see
//! [`super::tenant`]): the path begins at its first `/`, and everything
//! here but [`validate`] (which checks what a producer wrote) keeps the
//! scope in what it returns, so that a top-level directory, an ancestor or
//! a renamed path stays its tenant's.

use super::CommandError;

/// Most segments a path has: every ancestor is an indexed term of its
/// file (`path.tree`), so depth multiplies what one command writes.
pub const MAX_DEPTH: usize = 256;

/// Checks that `path` is absolute, has no empty, `.` or `..` segment, no
/// trailing slash and at most [`MAX_DEPTH`] segments. `what` names the
/// field in the error.
pub fn validate(what: &'static str, path: &str) -> Result<(), CommandError> {
    let invalid = |reason: &str| CommandError::InvalidPath { field: what, path: path.to_string(), reason: reason.to_string() };
    if !path.starts_with('/') {
        return Err(invalid("must be absolute (start with '/')"));
    }
    if path == "/" {
        return Err(invalid("must name something below '/'"));
    }
    if path.len() > super::MAX_TERM_LEN {
        return Err(invalid(&format!("is {} bytes, longer than {}", path.len(), super::MAX_TERM_LEN)));
    }
    for (n, segment) in path[1..].split('/').enumerate() {
        if n == MAX_DEPTH {
            return Err(invalid(&format!("has more than {MAX_DEPTH} segments")));
        }
        match segment {
            "" => return Err(invalid("has an empty segment")),
            "." | ".." => return Err(invalid("has a '.' or '..' segment")),
            s if s.chars().any(char::is_control) => return Err(invalid("has a control character")),
            _ => {}
        }
    }
    Ok(())
}

/// Where a valid path's root `/` is: 0, or after its tenant's scope (0
/// too for a string without a slash, such as a stored field gone
/// missing, which reads as a relative path).
fn root(path: &str) -> usize {
    path.find('/').unwrap_or(0)
}

/// Whether `dir` is a root: `/`, or a tenant's.
pub fn is_root(dir: &str) -> bool {
    dir.len() == root(dir) + 1
}

/// Number of segments of a valid path (`/a/b` has 2).
pub fn depth(path: &str) -> usize {
    path[root(path) + 1..].split('/').count()
}

/// The top-level directory of a valid path: `/clinton/projects` -> `/clinton`.
pub fn top_level(path: &str) -> &str {
    let r = root(path) + 1;
    match path[r..].find('/') {
        Some(i) => &path[..r + i],
        None => path,
    }
}

/// Splits a valid file path into its directory and name:
/// `/a/b/c.txt` -> (`/a/b`, `c.txt`). A file directly below `/` has directory `/`.
pub fn split(path: &str) -> (&str, &str) {
    let i = path.rfind('/').expect("valid path has a slash");
    let dir = if i == root(path) { &path[..i + 1] } else { &path[..i] };
    (dir, &path[i + 1..])
}

/// Every ancestor directory of `dir` and `dir` itself, outermost first:
/// `/a/b/c` -> [`/a`, `/a/b`, `/a/b/c`]. The root `/` has none.
pub fn tree(dir: &str) -> Vec<String> {
    if is_root(dir) {
        return Vec::new();
    }
    let mut out = Vec::with_capacity(depth(dir));
    for (i, c) in dir.char_indices().skip(root(dir) + 1) {
        if c == '/' {
            out.push(dir[..i].to_string());
        }
    }
    out.push(dir.to_string());
    out
}

/// True when `path` is `ancestor` itself or lies beneath it.
pub fn is_within(path: &str, ancestor: &str) -> bool {
    path == ancestor || (path.len() > ancestor.len() && path.starts_with(ancestor) && path.as_bytes()[ancestor.len()] == b'/')
}

/// Where the file at full path `path` ends up when `from` is renamed to `to`:
/// `None` when the rename does not touch it.
pub fn renamed(path: &str, from: &str, to: &str) -> Option<String> {
    if is_within(path, from) {
        Some(format!("{to}{}", &path[from.len()..]))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_paths() {
        assert!(validate("path", "/a/b.txt").is_ok());
        for bad in ["a/b", "/", "/a//b", "/a/", "/a/./b", "/a/../b", "", "/a/\nb"] {
            assert!(validate("path", bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn top_level_directory() {
        assert_eq!(top_level("/clinton/projects/x.txt"), "/clinton");
        assert_eq!(top_level("/clinton"), "/clinton");
    }

    #[test]
    fn splits_and_builds_tree() {
        assert_eq!(split("/a/b/c.txt"), ("/a/b", "c.txt"));
        assert_eq!(split("/c.txt"), ("/", "c.txt"));
        assert_eq!(tree("/clinton/projects/es"), vec!["/clinton", "/clinton/projects", "/clinton/projects/es"]);
        assert!(tree("/").is_empty());
    }

    #[test]
    fn a_tenants_paths_keep_their_scope() {
        let p = "acme\u{1f}/a/b/c.txt";
        assert_eq!(depth(p), 3);
        assert_eq!(top_level(p), "acme\u{1f}/a");
        assert_eq!(top_level("acme\u{1f}/a"), "acme\u{1f}/a");
        assert_eq!(split(p), ("acme\u{1f}/a/b", "c.txt"));
        assert_eq!(split("acme\u{1f}/c.txt"), ("acme\u{1f}/", "c.txt"));
        assert!(is_root("acme\u{1f}/") && is_root("/") && !is_root("acme\u{1f}/a"));
        assert_eq!(tree("acme\u{1f}/a/b"), vec!["acme\u{1f}/a", "acme\u{1f}/a/b"]);
        assert!(tree("acme\u{1f}/").is_empty());
        assert!(is_within(p, "acme\u{1f}/a"));
        assert!(!is_within(p, "/a"), "the default tenant's /a holds none of acme's");
        assert!(validate("path", p).is_err(), "a producer's path is never scoped");
    }

    #[test]
    fn within_respects_segment_boundaries() {
        assert!(is_within("/a/b", "/a/b"));
        assert!(is_within("/a/b/c", "/a/b"));
        assert!(!is_within("/a/bc", "/a/b"));
        assert!(!is_within("/a", "/a/b"));
    }

    #[test]
    fn renames_prefix_only_at_boundaries() {
        assert_eq!(renamed("/a/b/c.txt", "/a/b", "/a/z").as_deref(), Some("/a/z/c.txt"));
        assert_eq!(renamed("/a/b", "/a/b", "/a/z").as_deref(), Some("/a/z"));
        assert_eq!(renamed("/a/bc/d", "/a/b", "/a/z"), None);
    }
}
