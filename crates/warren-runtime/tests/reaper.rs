//! Commands run with `std::process::Command` in a process whose children are collected by the
//! one reaper still get their exit status and output.

#[test]
fn commands_get_their_status_in_a_process_with_a_reaper() {
    warren_runtime::reaper::start().unwrap();
    let handles: Vec<_> = (0..4)
        .map(|t| {
            std::thread::spawn(move || {
                for i in 0..25 {
                    let code = (t * 25 + i) % 7;
                    let o = warren_sys::children::output(
                        std::process::Command::new("sh")
                            .arg("-c")
                            .arg(format!("echo out{i}; echo err{i} >&2; exit {code}")),
                    )
                    .expect("the command ran");
                    assert_eq!(o.status.code(), Some(code));
                    assert_eq!(o.stdout, format!("out{i}\n").as_bytes());
                    assert_eq!(o.stderr, format!("err{i}\n").as_bytes());
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}
