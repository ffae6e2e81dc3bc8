//! The documents of `models/files-and-posts.toml` as the compiled-in
//! kinds' index documents: how a replay read as that model is compared
//! with the index the compiled-in code writes.

use std::collections::BTreeMap;

use super::{ModelReference, Value};
use crate::command::tenant;
use crate::index::{Author, Doc, FileDoc, Kind, PostDoc, UserDoc};

/// The reference's documents as the compiled-in index documents.
///
/// # Panics
///
/// On a reference of another model than `files_and_posts`.
pub fn as_compiled_in(r: &ModelReference) -> Vec<Doc> {
    let mut out = BTreeMap::new();
    for (k, d) in r.docs() {
        let t = k.tenant.as_deref();
        let f = |name: &str| match d.fields.get(name) {
            Some(Value::Str(v)) => v.clone(),
            other => panic!("{k:?} {name}: {other:?}"),
        };
        let id = tenant::scope(t, &k.id);
        let doc = match k.kind.as_str() {
            "file" => (Kind::File, Doc::File(FileDoc::at(&id, &tenant::scope(t, &f("path")), &f("contents"), 0))),
            "user" => (Kind::User, Doc::User(UserDoc { id: id.clone(), name: f("name"), email: f("email"), dob: f("dob"), pos: 0 })),
            "post" => {
                let name = match d.copies["user"].get("name") {
                    Some(Value::Str(n)) => n.clone(),
                    _ => String::new(),
                };
                (Kind::Post, Doc::Post(PostDoc { id: id.clone(), title: f("title"), body: f("body"), user: Author { id: tenant::scope(t, &f("user_id")), name }, pos: 0 }))
            }
            other => panic!("kind {other}"),
        };
        out.insert((doc.0, id), doc.1);
    }
    out.into_values().collect()
}
