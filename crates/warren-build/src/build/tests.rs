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
