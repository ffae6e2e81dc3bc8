//! The results table of `denorm bench`: its rows, how figures are shown,
//! and the phase headings printed as it goes.

/// One row of the results table.
pub(super) struct Row {
    name: String,
    denorm: String,
    baseline: String,
    ratio: Option<f64>,
    target: &'static str,
}

impl Row {
    pub(super) fn new(name: impl Into<String>, denorm: String, baseline: String, ratio: Option<f64>, target: &'static str) -> Row {
        Row { name: name.into(), denorm, baseline, ratio, target }
    }
}

pub(super) fn phase(text: &str) {
    eprintln!("bench: {text}");
}

pub(super) fn per_sec(rate: f64, what: &str) -> String {
    let what = if what.is_empty() { String::new() } else { format!(" {what}") };
    if rate >= 1000.0 {
        format!("{:.1}k{what}/s", rate / 1000.0)
    } else {
        format!("{rate:.0}{what}/s")
    }
}

pub(super) fn mb(kb: Option<u64>) -> String {
    kb.map(|k| format!("{:.0} MB", k as f64 / 1024.0)).unwrap_or_else(|| "unknown".into())
}

pub(super) fn print_table(rows: &[Row]) {
    let w0 = rows.iter().map(|r| r.name.len()).max().unwrap_or(0);
    let w1 = rows.iter().map(|r| r.denorm.len()).max().unwrap_or(0).max(6);
    let w2 = rows.iter().map(|r| r.baseline.len()).max().unwrap_or(0).max(8);
    println!("{:w0$}  {:w1$}  {:w2$}  {:>6}  target", "measure", "denorm", "baseline", "ratio");
    for r in rows {
        let ratio = r.ratio.map(|x| format!("{:.0}%", x * 100.0)).unwrap_or_default();
        println!("{:w0$}  {:w1$}  {:w2$}  {:>6}  {}", r.name, r.denorm, r.baseline, ratio, r.target);
    }
}
