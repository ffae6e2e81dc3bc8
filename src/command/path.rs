//! Absolute slash-separated paths: validation, top-level directory (the
//! ordering key of filesystem commands), ancestors (`path.tree`) and renames.

use super::CommandError;

/// Checks that `path` is absolute, has no empty, `.` or `..` segment and no
/// trailing slash. `what` names the field in the error.
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
    for segment in path[1..].split('/') {
        match segment {
            "" => return Err(invalid("has an empty segment")),
            "." | ".." => return Err(invalid("has a '.' or '..' segment")),
            s if s.chars().any(char::is_control) => return Err(invalid("has a control character")),
            _ => {}
        }
    }
    Ok(())
}

/// Number of segments of a valid path (`/a/b` has 2).
pub fn depth(path: &str) -> usize {
    path[1..].split('/').count()
}

/// The top-level directory of a valid path: `/clinton/projects` -> `/clinton`.
pub fn top_level(path: &str) -> &str {
    match path[1..].find('/') {
        Some(i) => &path[..i + 1],
        None => path,
    }
}

/// Splits a valid file path into its directory and name:
/// `/a/b/c.txt` -> (`/a/b`, `c.txt`). A file directly below `/` has directory `/`.
pub fn split(path: &str) -> (&str, &str) {
    let i = path.rfind('/').expect("valid path has a slash");
    let dir = if i == 0 { "/" } else { &path[..i] };
    (dir, &path[i + 1..])
}

/// Every ancestor directory of `dir` and `dir` itself, outermost first:
/// `/a/b/c` -> [`/a`, `/a/b`, `/a/b/c`]. The root `/` has none.
pub fn tree(dir: &str) -> Vec<String> {
    if dir == "/" {
        return Vec::new();
    }
    let mut out = Vec::with_capacity(depth(dir));
    for (i, c) in dir.char_indices().skip(1) {
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
