//! The built-in table, its matching rules, and the override layers.

use tagstripe_quirks::{
    Error, ForceString, Identity, Layer, Limits, Location, QuirkSet, QuirkTable, Warning,
};

fn id(s: &str) -> Identity {
    Identity::parse(s)
}

#[test]
fn builtin_table_holds_every_reference_row_with_its_source() {
    let t = QuirkTable::builtin();
    assert_eq!(t.rows().len(), 112);
    for row in t.rows() {
        assert!(!row.source.is_empty(), "row without source: {row:?}");
        assert!(
            row.source.starts_with("linux:") || row.source.starts_with("freebsd:"),
            "{}",
            row.source
        );
    }
    let mod15: Vec<_> = t
        .rows()
        .iter()
        .filter(|r| r.enabled && r.settings.mod15write == Some(true))
        .collect();
    assert_eq!(
        mod15.len(),
        12,
        "11 Seagate models and one Toshiba in sata_sil today"
    );
}

#[test]
fn first_match_wins_so_exclusion_rows_work() {
    let t = QuirkTable::builtin();
    // Intel 510 (SSDSC2MH) must not get the ZERO_AFTER_TRIM of the INTEL*SSD* row below it.
    let r = t.first_match(&id("ATA|INTEL SSDSC2MH120A2|PWG2")).unwrap();
    assert!(r.flags.is_empty() && r.settings.is_empty());
    let r = t
        .first_match(&id("ATA|INTEL SSDSC2BB480G4|D2010370"))
        .unwrap();
    assert_eq!(r.flags, "ATA_QUIRK_ZERO_AFTER_TRIM");
    // Crucial MX100 with MU01 firmware hits the row before the catch-all.
    let r = t
        .first_match(&id("ATA|Crucial_CT512MX100SSD1|MU01"))
        .unwrap();
    assert!(r.flags.contains("NO_NCQ_TRIM"));
    let r = t
        .first_match(&id("ATA|Crucial_CT512MX100SSD1|MU02"))
        .unwrap();
    assert!(!r.flags.contains("NO_NCQ_TRIM"));
}

#[test]
fn match_kinds_follow_each_kernel() {
    let t = QuirkTable::builtin();
    // sata_sil: exact strcmp, no prefix.
    assert!(
        t.first_match(&id("ATA|ST380023AS|3.01"))
            .is_some_and(|r| r.settings.mod15write == Some(true))
    );
    assert!(
        t.first_match(&id("ATA|ST380023ASX|3.01"))
            .is_none_or(|r| r.settings.mod15write.is_none())
    );
    // CAM: globs on firmware too.
    let r = t.first_match(&id("SEAGATE|ST410800N|7100")).unwrap();
    assert_eq!(r.settings.ncq, Some(false));
    assert!(t.first_match(&id("SEAGATE|ST410800N|6500")).is_none());
    // scsi_devinfo: vendor exact, model prefix.
    let r = t.first_match(&id("SYNOLOGY|iSCSI Storage 4.0|")).unwrap();
    assert_eq!(r.settings.max_sec, Some(1024));
    assert!(t.first_match(&id("SYNOLOGYX|iSCSI Storage|")).is_none());
    // libata character classes.
    assert!(
        t.first_match(&id("ATA|ST3640623AS|SD17"))
            .is_some_and(|r| r.settings.ncq == Some(false))
    );
    assert!(t.first_match(&id("ATA|ST3640523AS|SD17")).is_none());
}

#[test]
fn disabled_rows_are_listed_but_not_matched() {
    let t = QuirkTable::builtin();
    let slow_down = t
        .rows()
        .iter()
        .find(|r| r.flags.contains("slow_down"))
        .unwrap();
    assert!(!slow_down.enabled);
    assert!(
        t.first_match(&id("ATA|SOME DISK|1.0")).is_none(),
        "no catch-all row may be active"
    );
}

#[test]
fn layers_apply_in_order_builtin_file_force() {
    let toml = "[[quirk]]\nmodel = \"ST3*\"\nmax_tags = 8\nmax_sec = 1024\n";
    let set = QuirkSet::builtin()
        .with_file(toml, "site.toml")
        .unwrap()
        .with_force("ST380023AS:max_tags=4")
        .unwrap();
    let r = set.resolve(&id("ATA|ST380023AS|3.01"));
    let layers: Vec<Layer> = r.matches.iter().map(|m| m.layer).collect();
    assert_eq!(layers, [Layer::Builtin, Layer::File, Layer::Force]);
    assert_eq!(r.settings.mod15write, Some(true));
    assert_eq!(r.settings.max_sec, Some(1024));
    assert_eq!(r.settings.max_tags, Some(4));
}

#[test]
fn caps_above_the_hardware_are_clamped_with_a_warning() {
    let mut hw = Limits::default();
    hw.max_hw_sectors = 256;
    hw.max_tags = 32;
    let set = QuirkSet::empty()
        .with_force("*:max_sec=1024,max_tags=64,max_sectors_kb=64")
        .unwrap();
    let a = set.apply(&id("ATA|X|1"), &hw).unwrap();
    assert_eq!(a.limits.max_hw_sectors, 256);
    assert_eq!(a.limits.max_tags, 32);
    assert_eq!(a.limits.max_sectors, 128);
    assert_eq!(
        a.warnings,
        [
            Warning::Clamped {
                key: "max_sec",
                asked: 1024,
                limit: 256
            },
            Warning::Clamped {
                key: "max_tags",
                asked: 64,
                limit: 32
            }
        ]
    );
}

#[test]
fn force_string_errors_name_the_position() {
    let e = ForceString::parse("ST380023AS:max_sec=15,*:max_tagz=16").unwrap_err();
    assert_eq!(
        e,
        Error::UnknownKey {
            key: "max_tagz".into(),
            at: Location::Offset(22)
        }
    );
    let e = ForceString::parse("max_sec=0").unwrap_err();
    assert!(
        matches!(
            e,
            Error::BadValue {
                at: Location::Offset(0),
                ..
            }
        ),
        "{e:?}"
    );
    let e = ForceString::parse("noncq=yes").unwrap_err();
    assert!(matches!(e, Error::BadValue { .. }), "{e:?}");
    let e = ForceString::parse("noncq,,nofua").unwrap_err();
    assert!(
        matches!(
            e,
            Error::Malformed {
                at: Location::Offset(6),
                ..
            }
        ),
        "{e:?}"
    );
    let e = ForceString::parse("ST[38:max_sec=15").unwrap_err();
    assert!(matches!(e, Error::BadPattern { .. }), "{e:?}");
    let e = ForceString::parse(":noncq").unwrap_err();
    assert!(matches!(e, Error::Malformed { .. }), "{e:?}");
    assert!(ForceString::parse("").unwrap().entries().is_empty());
}

#[test]
fn force_entries_without_id_reuse_the_previous_one() {
    let f = ForceString::parse("noncq,ST380023AS:max_sec=15,max_tags=2").unwrap();
    let other = f.settings_for(&id("ATA|OTHER|1"));
    assert_eq!(
        (other.ncq, other.max_sec, other.max_tags),
        (Some(false), None, None)
    );
    let st = f.settings_for(&id("ATA|ST380023AS|1"));
    assert_eq!(
        (st.ncq, st.max_sec, st.max_tags),
        (Some(false), Some(15), Some(2))
    );
    let triple = ForceString::parse("SEAGATE|ST3*|71*:noncq").unwrap();
    assert_eq!(
        triple.settings_for(&id("SEAGATE|ST34520N|7100")).ncq,
        Some(false)
    );
    assert_eq!(triple.settings_for(&id("SEAGATE|ST34520N|6100")).ncq, None);
}

#[test]
fn toml_errors_name_the_line() {
    let bad_key = "[[quirk]]\nmodel = \"A\"\n\n[[quirk]]\nmodel = \"B\"\nmax_secs = 3\n";
    let e = QuirkTable::from_toml(bad_key, "f.toml").unwrap_err();
    assert_eq!(
        e,
        Error::UnknownKey {
            key: "max_secs".into(),
            at: Location::Line {
                input: "f.toml".into(),
                line: 6
            }
        }
    );
    let bad_type = "[[quirk]]\nmodel = \"A\"\nmax_sec = true\n";
    let e = QuirkTable::from_toml(bad_type, "f.toml").unwrap_err();
    assert!(
        matches!(
            e,
            Error::BadValue {
                at: Location::Line { line: 3, .. },
                ..
            }
        ),
        "{e:?}"
    );
    let bad_flag = "[[quirk]]\nmodel = \"A\"\nmod15write = 3\n";
    assert!(matches!(
        QuirkTable::from_toml(bad_flag, "f.toml").unwrap_err(),
        Error::BadValue { .. }
    ));
    let syntax = "[[quirk]]\nmodel = \"A\nmax_sec = 1\n";
    assert!(matches!(
        QuirkTable::from_toml(syntax, "f.toml").unwrap_err(),
        Error::Malformed {
            at: Location::Line { line: 2, .. },
            ..
        }
    ));
    let bad_glob = "[[quirk]]\nmodel = \"[A\"\n";
    assert!(matches!(
        QuirkTable::from_toml(bad_glob, "f.toml").unwrap_err(),
        Error::BadPattern { .. }
    ));
    let negative = "[[quirk]]\nmax_tags = -4\n";
    assert!(matches!(
        QuirkTable::from_toml(negative, "f.toml").unwrap_err(),
        Error::BadValue { .. }
    ));
    let other_table = "[quirks]\nmodel = \"A\"\n";
    assert!(matches!(
        QuirkTable::from_toml(other_table, "f.toml").unwrap_err(),
        Error::Malformed { .. }
    ));
}

#[test]
fn toml_rows_take_match_kind_and_source() {
    let text = "[[quirk]]\nvendor = \"ACME\"\nmodel = \"Disk\"\nmatch = \"prefix\"\nsource = \"lab 2026\"\nncq = false\n";
    let t = QuirkTable::from_toml(text, "f.toml").unwrap();
    let r = t.first_match(&id("ACME|Disk 9000|1")).unwrap();
    assert_eq!(r.source, "lab 2026");
    assert_eq!(r.settings.ncq, Some(false));
    assert!(
        t.first_match(&id("ACMEX|Disk 9000|1")).is_some(),
        "prefix applies to vendor too"
    );
}
