use super::config::duration;
use super::*;

#[test]
fn durations_and_healthchecks() {
    assert_eq!(duration("30s"), Some(30.0));
    assert_eq!(duration("1m30s"), Some(90.0));
    assert_eq!(duration("500ms"), Some(0.5));
    assert_eq!(duration("5"), None);
    let d = crate::parse::parse(
        "FROM x\nHEALTHCHECK --interval=5s --retries=3 CMD curl -f http://x/\n",
    )
    .unwrap();
    let h = healthcheck(&d.instructions[1]).unwrap();
    assert_eq!(h.test, ["CMD-SHELL", "curl -f http://x/"]);
    assert_eq!((h.interval_ms, h.retries), (Some(5000), Some(3)));
}

#[test]
fn stages_split_and_refuse_instructions_before_from() {
    let d = crate::parse::parse("ARG V=1\nFROM a AS one\nRUN x\nFROM one\nCOPY --from=one /a /b\n")
        .unwrap();
    let (g, s) = stages(&d).unwrap();
    assert_eq!((g.len(), s.len(), s[0].body.len()), (1, 2, 2));
    assert!(stages(&crate::parse::parse("RUN x\nFROM a\n").unwrap()).is_err());
    assert!(stages(&crate::parse::parse("ARG x\n").unwrap()).is_err());
}

#[test]
fn long_output_lines_are_cut_on_character_boundaries() {
    use super::utf8_cut;
    assert_eq!(utf8_cut(b"abc", 8), 3);
    assert_eq!(utf8_cut(b"abcdef", 4), 4);
    // "é" is two bytes: a cut inside it moves before it.
    let s = "abcé".as_bytes();
    assert_eq!(utf8_cut(s, 4), 3);
    // A four-byte character cut after its first byte.
    let s = "a😀b".as_bytes();
    assert_eq!(utf8_cut(s, 2), 1);
    // Not UTF-8 (continuation bytes only): cut where asked.
    assert_eq!(utf8_cut(&[0x80; 10], 5), 5);
}
