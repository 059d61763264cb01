//! `tagstripe map --json` against every reference case, and its handling of bad input.

use std::process::{Command, Output};

use serde_json::{Value, json};

fn tagstripe(args: &[String]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tagstripe"))
        .args(args)
        .output()
        .expect("run tagstripe")
}

fn args_for(input: &Value) -> Vec<String> {
    let sizes: Vec<String> = input["sizes"]
        .as_array()
        .unwrap()
        .iter()
        .map(ToString::to_string)
        .collect();
    let mut a = vec![
        "map".to_owned(),
        "--json".to_owned(),
        format!("--sizes={}", sizes.join(",")),
        format!("--interleave={}", input["ileave"]),
        format!("--flavor={}", input["flavor"].as_str().unwrap()),
        format!("--secsize={}", input["secsize"]),
    ];
    for flag in ["uniform", "mirror", "no_offset", "linux"] {
        if input[flag].as_bool().unwrap() {
            a.push(format!("--{}", flag.replace('_', "-")));
        }
    }
    a.push("--request".to_owned());
    for r in input["requests"].as_array().unwrap() {
        a.push(format!(
            "{}:{}:{}",
            r["op"].as_str().unwrap(),
            r["start"],
            r["count"]
        ));
    }
    a
}

/// The reference case's expectation, in the CLI's JSON contract.
fn expected_json(exp: &Value) -> Value {
    let table: Vec<Value> = exp["table"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| json!({"ndisk": t["ndisk"], "index": t["index"], "lblk_start": t["lblk_start"], "cblk_start": t["cblk_start"], "lblk_span": t["lblk_span"]}))
        .collect();
    let requests: Vec<Value> = exp["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let mut v = json!({
                "op": r["op"], "start": r["start"], "count": r["count"], "status": r["status"],
                "effective_count": r["effective_count"], "pieces": r["pieces"], "issued": r["issued"],
            });
            if let Some(e) = r.get("errno") {
                v["errno"] = e.clone();
            }
            v
        })
        .collect();
    let eff = &exp["effective"];
    json!({
        "flavor": null, "interleave": eff["ileave"], "uniform": eff["uniform"], "mirror": eff["mirror"],
        "notes": exp["notes"], "total_sectors": eff["total_blocks"], "component_sizes": eff["component_sizes"],
        "reserved_offset": eff["reserved_offset"], "table": table, "requests": requests,
    })
}

#[test]
fn map_json_reproduces_all_reference_cases() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../striping/tests/vectors");
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let (mut n, mut failures) = (0, Vec::new());
    for f in files
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
    {
        for (i, line) in std::fs::read_to_string(f).unwrap().lines().enumerate() {
            n += 1;
            let case: Value = serde_json::from_str(line).unwrap();
            let name = format!("{}:{}", f.display(), i + 1);
            let out = tagstripe(&args_for(&case["input"]));
            let got: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
            let exp = &case["expected"];
            if !exp["ok"].as_bool().unwrap() {
                if out.status.code() != Some(2) || got["error"]["errno"] != exp["errno"] {
                    failures.push(format!(
                        "{name}: expected refusal {}, got {got}",
                        exp["errno"]
                    ));
                }
                continue;
            }
            let mut got = got;
            if !out.status.success() {
                failures.push(format!("{name}: exit {:?}: {got}", out.status.code()));
                continue;
            }
            got["flavor"] = Value::Null;
            let want = expected_json(exp);
            if got != want {
                failures.push(format!("{name}:\n got  {got}\n want {want}"));
            }
        }
    }
    assert_eq!(n, 329);
    assert!(
        failures.is_empty(),
        "{} cases differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn bad_flags_exit_2_with_a_message() {
    for bad in [
        vec!["map", "--sizes", "100,x", "--interleave", "1"],
        vec![
            "map",
            "--sizes",
            "100",
            "--interleave",
            "1",
            "--flavor",
            "sunos",
        ],
        vec![
            "map",
            "--sizes",
            "100",
            "--interleave",
            "1",
            "--request",
            "q:1:2",
        ],
        vec![
            "map",
            "--sizes",
            "100",
            "--interleave",
            "1",
            "--request",
            "1:-2",
        ],
        vec![
            "map",
            "--sizes",
            "100",
            "--interleave",
            "1",
            "--request",
            "99999999999999999999:1",
        ],
        vec!["map", "--interleave", "1"],
        vec!["map", "--sizes", "100", "--interleave", "1", "--bogus"],
    ] {
        let out = tagstripe(&bad.iter().map(ToString::to_string).collect::<Vec<_>>());
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        assert!(!out.stderr.is_empty(), "{bad:?} printed no message");
    }
}

#[test]
fn refused_geometry_exits_2_with_error_json() {
    let out = tagstripe(
        &[
            "map",
            "--json",
            "--sizes",
            "1000,15,1000",
            "--interleave",
            "16",
        ]
        .map(String::from),
    );
    assert_eq!(out.status.code(), Some(2));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["error"]["kind"], "component_smaller_than_interleave");
    assert_eq!(v["error"]["errno"], "ENODEV");
    assert_eq!(
        v["error"]["message"],
        "component 1 is smaller than the interleave"
    );
}

#[test]
fn readable_view_shows_table_and_pieces() {
    let out = tagstripe(
        &[
            "map",
            "--sizes",
            "1000,2000,1500",
            "--interleave",
            "16",
            "--request",
            "w:4470:20",
        ]
        .map(String::from),
    );
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("netbsd, interleave 16, 3 components, 4480 sectors"),
        "{text}"
    );
    assert!(text.contains("request w:4470:20  truncated"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["4470", "1", "1990", "10", "-"]),
        "{text}"
    );
}

fn md_map(args: &[&str]) -> (Option<i32>, Value) {
    let mut a: Vec<String> = vec!["map".into(), "--json".into()];
    a.extend(args.iter().map(|s| (*s).to_owned()));
    let o = tagstripe(&a);
    let v = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stdout)));
    (o.status.code(), v)
}

/// `map --level` prints the md contract: raid5's pieces with P (left-symmetric, four
/// members: stripe 1 starts on the member after P), raid6's with Q, raid10's copies in md's
/// order, and `error` for a request past the end.
#[test]
fn md_levels_as_scripts_read_them() {
    let (code, v) = md_map(&[
        "--level",
        "raid5",
        "--disks",
        "4",
        "--chunk",
        "128",
        "--size",
        "1000",
        "--request",
        "0:300",
        "w:384:128",
        "2600:200",
    ]);
    assert_eq!(code, Some(0));
    assert_eq!(
        (
            &v["level"],
            &v["layout"],
            &v["disks"],
            &v["chunk"],
            &v["total_sectors"]
        ),
        (
            &json!("raid5"),
            &json!("left-symmetric"),
            &json!(4),
            &json!(128),
            &json!(2688)
        )
    );
    let r = &v["requests"];
    assert_eq!(r[0]["status"], "ok");
    assert_eq!(
        r[0]["pieces"],
        json!([
            {"lblk": 0, "count": 128, "comp": 0, "cblk": 0, "p_comp": 3},
            {"lblk": 128, "count": 128, "comp": 1, "cblk": 0, "p_comp": 3},
            {"lblk": 256, "count": 44, "comp": 2, "cblk": 0, "p_comp": 3}
        ])
    );
    assert_eq!(r[1]["op"], "w");
    assert_eq!(
        r[1]["pieces"],
        json!([{"lblk": 384, "count": 128, "comp": 3, "cblk": 128, "p_comp": 2}])
    );
    assert_eq!(
        (&r[2]["status"], &r[2]["pieces"]),
        (&json!("error"), &json!([]))
    );

    let (_, v) = md_map(&[
        "--level",
        "raid6",
        "--disks",
        "5",
        "--chunk",
        "8",
        "--size",
        "64",
        "--request",
        "0:8",
    ]);
    assert_eq!(
        v["requests"][0]["pieces"],
        json!([{"lblk": 0, "count": 8, "comp": 1, "cblk": 0, "p_comp": 4, "q_comp": 0}])
    );
    let (_, v) = md_map(&[
        "--level",
        "raid10",
        "--disks",
        "4",
        "--chunk",
        "8",
        "--size",
        "64",
        "--layout",
        "f2",
        "--request",
        "8:8",
    ]);
    assert_eq!(v["layout"], "f2");
    assert_eq!(
        v["requests"][0]["pieces"],
        json!([{"lblk": 8, "count": 8, "copies": [{"comp": 1, "cblk": 0}, {"comp": 2, "cblk": 32}]}])
    );
}

/// Arrays md would refuse exit 2 with the reason, as JSON with --json.
#[test]
fn md_refusals_exit_2_with_the_reason() {
    for (args, kind) in [
        (
            vec![
                "--level", "raid5", "--disks", "4", "--chunk", "12", "--size", "100",
            ],
            "invalid_chunk",
        ),
        (
            vec![
                "--level", "raid6", "--disks", "3", "--chunk", "8", "--size", "100",
            ],
            "too_few_disks",
        ),
        (
            vec![
                "--level",
                "raid5",
                "--disks",
                "4",
                "--chunk",
                "8",
                "--size",
                "100",
                "--layout",
                "left-symmetric-6",
            ],
            "layout_unsupported",
        ),
        (
            vec![
                "--level", "raid10", "--disks", "4", "--chunk", "8", "--size", "100", "--layout",
                "z9",
            ],
            "layout_unsupported",
        ),
        (
            vec![
                "--level", "raid5", "--disks", "4", "--chunk", "64", "--size", "10",
            ],
            "member_too_small",
        ),
    ] {
        let mut a = args.clone();
        a.extend(["--request", "0:1"]);
        let (code, v) = md_map(&a);
        assert_eq!(code, Some(2), "{args:?}");
        assert_eq!(v["error"]["kind"], kind, "{args:?}: {v}");
    }
    // Flags of the other form are refused by the parser.
    let o = tagstripe(
        &[
            "map",
            "--level",
            "raid5",
            "--sizes",
            "100",
            "--disks",
            "4",
            "--chunk",
            "8",
            "--size",
            "64",
            "--request",
            "0:1",
        ]
        .map(String::from),
    );
    assert_eq!(o.status.code(), Some(2));
}
