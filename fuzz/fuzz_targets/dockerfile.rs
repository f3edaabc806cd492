//! Fuzzes the Dockerfile parser and argument substitution: any text parses or is refused
//! with a typed error naming its line, never a panic; every instruction's arguments go
//! through word splitting and `KEY=value` pairing the way the planner uses them.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let Ok(df) = warren_build::parse::parse(&text) else {
        return;
    };
    let vars = vec![("A".to_string(), "x y".to_string())];
    for i in &df.instructions {
        let t = i.args.text();
        let _ = warren_build::words::words(&t, &vars, df.escape);
        let _ = warren_build::words::word(&t, &vars, df.escape);
        let _ = warren_build::words::pairs(&t, &vars, df.escape, true);
        let _ = i.display();
        for h in &i.heredocs {
            let _ = warren_build::words::word(&h.body, &vars, '\u{0}');
        }
    }
});
