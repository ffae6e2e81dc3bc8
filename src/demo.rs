//! A realistic, deterministic sample data set (files in several top-level
//! trees, users, posts with a skewed author distribution) for the demo,
//! tests and benchmarks.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::command::Command;

/// Top-level directories, with `/clinton` the largest tree.
pub const TOP_DIRS: &[&str] = &["/clinton", "/bill", "/hillary", "/chelsea", "/al", "/tipper"];
const PROJECTS: &[&str] = &["elasticsearch", "kibana", "logstash", "beats", "lucene", "tantivy", "kafka", "denorm"];
const SECTIONS: &[&str] = &["src", "docs", "tests", "notes", "design"];
const WORDS: &[&str] = &[
    "search",
    "index",
    "document",
    "query",
    "shard",
    "replica",
    "cluster",
    "node",
    "mapping",
    "analyzer",
    "token",
    "term",
    "score",
    "relevance",
    "filter",
    "aggregation",
    "bucket",
    "rename",
    "directory",
    "file",
    "path",
    "tree",
    "lock",
    "log",
    "offset",
    "partition",
    "consumer",
    "producer",
    "broker",
    "topic",
    "commit",
    "replay",
    "rebuild",
    "alias",
    "project",
    "release",
    "meeting",
    "budget",
    "travel",
    "garden",
    "recipe",
    "family",
    "weekend",
    "holiday",
    "music",
    "relationships",
    "complicated",
    "easy",
    "starting",
    "new",
    "fast",
    "slow",
    "simple",
    "careful",
    "denormalized",
];
const FIRST: &[&str] = &["John", "Mary", "Ann", "Bob", "Cy", "Dana", "Eve", "Finn", "Gus", "Hana", "Ivan", "Jo", "Kim", "Lee", "Max", "Nia"];
const LAST: &[&str] = &["Smith", "Jones", "Brown", "Clark", "Lewis", "Young", "King", "Wright", "Hill", "Green", "Baker", "Adams"];
const TOPICS: &[&str] = &["Relationships", "Cooking", "Travel", "Search engines", "Gardening", "Music", "Family", "Budgets"];

/// The file every demo race renames.
pub const README: &str = "/clinton/projects/elasticsearch/README.txt";

/// `n` words of the sample vocabulary.
pub fn words(rng: &mut StdRng, n: usize) -> String {
    (0..n).map(|_| WORDS[rng.random_range(0..WORDS.len())]).collect::<Vec<_>>().join(" ")
}

/// `files` file upserts (half of them in `/clinton`, most under
/// `/clinton/projects`), `users` users and `posts` posts, a tenth of them by
/// user `1` ("John Smith").
pub fn seed(files: usize, users: usize, posts: usize, seed: u64) -> Vec<Command> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::with_capacity(files + users + posts);
    for i in 0..files {
        let path = if i == 0 {
            README.to_string()
        } else {
            let top = if rng.random_bool(0.5) { TOP_DIRS[0] } else { TOP_DIRS[rng.random_range(1..TOP_DIRS.len())] };
            let area = if top == "/clinton" && rng.random_bool(0.1) { "personal" } else { "projects" };
            let project = PROJECTS[rng.random_range(0..PROJECTS.len())];
            let section = SECTIONS[rng.random_range(0..SECTIONS.len())];
            format!("{top}/{area}/{project}/{section}/file{i}.txt")
        };
        let contents = if i == 0 {
            "Starting a new Elasticsearch project is easy...".to_string()
        } else {
            let n = rng.random_range(8..24);
            words(&mut rng, n)
        };
        out.push(Command::UpsertFile { id: format!("f{i}"), path, contents, previous_path: None });
    }
    for u in 1..=users {
        let name = if u == 1 { "John Smith".to_string() } else { format!("{} {}", FIRST[rng.random_range(0..FIRST.len())], LAST[rng.random_range(0..LAST.len())]) };
        let email = format!("{}@example.com", name.to_lowercase().replace(' ', "."));
        let dob = format!("{}-{:02}-{:02}", rng.random_range(1940..2005), rng.random_range(1..=12), rng.random_range(1..=28));
        out.push(Command::UpsertUser { id: u.to_string(), name, email, dob });
    }
    for p in 0..posts {
        let user = if users == 0 || p % 10 == 0 {
            1
        } else {
            // Skewed: low ids write most.
            let r: f64 = rng.random();
            1 + ((r * r) * users as f64) as usize % users
        };
        let title = format!("{} #{p}", TOPICS[rng.random_range(0..TOPICS.len())]);
        let n = rng.random_range(10..40);
        let body = words(&mut rng, n);
        out.push(Command::UpsertPost { id: format!("p{p}"), user_id: user.to_string(), title, body, previous_user_id: None });
    }
    out
}

/// The race of the seed: a directory rename of `/clinton/projects` and a
/// rename of the README inside it, issued concurrently.
pub fn race() -> (Command, Command) {
    (Command::RenamePath { from: "/clinton/projects".into(), to: "/clinton/work".into() }, Command::RenamePath { from: README.into(), to: "/clinton/projects/elasticsearch/README.md".into() })
}

/// The demo's renames across top-level directories: a subtree moved to
/// another tree, a directory moved to another tree, and a whole tree
/// renamed.
pub fn moves() -> Vec<Command> {
    let r = |from: &str, to: &str| Command::RenamePath { from: from.into(), to: to.into() };
    vec![r("/hillary/projects", "/bill/hillary-projects"), r("/clinton/work/elasticsearch", "/chelsea/elasticsearch"), r("/al", "/albert")]
}

/// The demo's two tenants: `acme` and `globex` write the same paths, file
/// ids and user ids, then `acme` renames its `/clinton/work` and `globex`
/// renames its user 1 (see docs/tenants.md).
pub const TENANTS: [&str; 2] = ["acme", "globex"];

/// The commands of [`TENANTS`], scoped to each (every tenant's own copy
/// of the same names).
pub fn tenants() -> Vec<Command> {
    let mut out = Vec::new();
    for t in TENANTS {
        let file = |i: usize| Command::UpsertFile { id: format!("t{i}"), path: format!("/clinton/work/notes/{i}.txt"), contents: format!("{t} notes on the project, page {i}"), previous_path: None };
        out.extend((1..=3).map(|i| file(i).scoped(Some(t))));
        out.push(Command::UpsertUser { id: "1".into(), name: format!("John {t}"), email: format!("john@{t}.example"), dob: "1970-10-24".into() }.scoped(Some(t)));
        out.push(Command::UpsertPost { id: "t-p1".into(), user_id: "1".into(), title: format!("{t} relationships"), body: "It's complicated...".into(), previous_user_id: None }.scoped(Some(t)));
    }
    out.push(Command::RenamePath { from: "/clinton/work/notes".into(), to: "/clinton/archive".into() }.scoped(Some("acme")));
    out.push(Command::UpsertUser { id: "1".into(), name: "Jonathan globex".into(), email: "john@globex.example".into(), dob: "1970-10-24".into() }.scoped(Some("globex")));
    out
}

/// Renames of `n` users (user 1 and the next most prolific ones).
pub fn user_renames(n: usize, seed: u64) -> Vec<Command> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0xD15EA5E);
    (1..=n)
        .map(|u| Command::UpsertUser {
            id: u.to_string(),
            name: if u == 1 { "Johnny Smith".into() } else { format!("{} {}-{}", FIRST[rng.random_range(0..FIRST.len())], LAST[rng.random_range(0..LAST.len())], "Renamed") },
            email: format!("user{u}@example.org"),
            dob: "1970-10-24".into(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_is_valid_deterministic_and_skewed() {
        let a = seed(2000, 50, 500, 7);
        assert_eq!(a, seed(2000, 50, 500, 7));
        assert!(a.iter().all(|c| c.validate().is_ok()));
        let under_projects = a.iter().filter(|c| matches!(c, Command::UpsertFile { path, .. } if path.starts_with("/clinton/projects/"))).count();
        assert!(under_projects > 600, "{under_projects}");
        let by_one = a.iter().filter(|c| matches!(c, Command::UpsertPost { user_id, .. } if user_id == "1")).count();
        assert!(by_one >= 50, "{by_one}");
    }

    #[test]
    fn the_tenants_share_names_and_nothing_else() {
        let t = tenants();
        assert!(t.iter().all(|c| c.validate_scoped().is_ok() && c.tenant().is_some()));
        let keys = |tenant: &str| t.iter().filter(|c| c.tenant() == Some(tenant)).map(|c| crate::command::tenant::unscoped(c.key()).to_string()).collect::<std::collections::BTreeSet<_>>();
        assert_eq!(keys("acme"), keys("globex"), "the same names");
        assert!(keys("acme").contains("/clinton"));
    }
}
