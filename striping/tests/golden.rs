//! Golden text tests: rendered geometries in `tests/golden/tables.txt`.
//!
//! Each case is a line `geometry sizes=.. interleave=.. [flavor=..] [uniform] [mirror]
//! [no_offset] [linux]`, a `----` line, and the expected rendering up to a blank line. Run with
//! `TAGSTRIPE_REWRITE_GOLDEN=1` to regenerate the expected text after an intended change.

use tagstripe_striping::Geometry;

fn render(command: &str) -> String {
    let mut words = command.split_whitespace();
    assert_eq!(
        words.next(),
        Some("geometry"),
        "unknown command {command:?}"
    );
    let mut sizes = Vec::new();
    let mut il = 0;
    let mut b_flags = Vec::new();
    let mut flavor = "netbsd".to_owned();
    for w in words {
        match w.split_once('=') {
            Some(("sizes", v)) => sizes = v.split(',').map(|s| s.parse().unwrap()).collect(),
            Some(("interleave", v)) => il = v.parse().unwrap(),
            Some(("flavor", v)) => flavor = v.to_owned(),
            None => b_flags.push(w),
            Some((k, _)) => panic!("unknown key {k}"),
        }
    }
    let mut b = Geometry::builder(sizes, il);
    b.flavor(flavor.parse().unwrap());
    for f in b_flags {
        match f {
            "uniform" => b.uniform(true),
            "mirror" => b.mirror(true),
            "no_offset" => b.no_offset(true),
            "linux" => b.linux(true),
            _ => panic!("unknown flag {f}"),
        };
    }
    match b.build() {
        Ok(g) => g.to_string(),
        Err(e) => format!("error: {e}\n"),
    }
}

#[test]
fn rendered_tables_match_golden_file() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/tables.txt");
    let text = std::fs::read_to_string(path).expect("golden file");
    let mut out = String::new();
    let mut mismatches = Vec::new();
    for block in text.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let (command, expected) = block.split_once("\n----").expect("command, ----, expected");
        let expected = expected.strip_prefix('\n').unwrap_or(expected);
        let got = render(command.trim());
        if got.trim_end() != expected.trim_end() {
            mismatches.push(format!(
                "{command}\n--- expected\n{expected}\n--- got\n{got}"
            ));
        }
        out.push_str(&format!("{}\n----\n{}\n\n", command.trim(), got.trim_end()));
    }
    if std::env::var_os("TAGSTRIPE_REWRITE_GOLDEN").is_some() {
        std::fs::write(path, out).expect("rewrite golden file");
        return;
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n\n"));
}
