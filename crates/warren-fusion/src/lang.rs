//! The languages: every name the protocol knows, and how each one Warren serves is run.
//!
//! `{src}` in a command is the source file's name, `{bin}` the program a compile makes; both
//! are relative to [`crate::WORKDIR`]. A served language whose tools an image lacks is
//! answered as a `SandboxError` naming the missing tool, never as a compile failure of the
//! caller's program.

/// Every language name of the protocol (requests naming another are invalid), and `c`.
pub const KNOWN: &[&str] = &[
    "python",
    "python2",
    "cpp",
    "c",
    "nodejs",
    "go",
    "go_test",
    "java",
    "php",
    "csharp",
    "bash",
    "typescript",
    "sql",
    "rust",
    "cuda",
    "lua",
    "R",
    "perl",
    "D_ut",
    "ruby",
    "scala",
    "julia",
    "pytest",
    "junit",
    "kotlin_script",
    "jest",
    "verilog",
    "python_gpu",
    "lean",
    "swift",
    "racket",
    "gtest",
    "react",
];

/// Whether `name` is a language of the protocol.
pub fn known(name: &str) -> bool {
    KNOWN.contains(&name)
}

/// How a language is run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Toolchain {
    /// `python3 <src>` on the pool's warm interpreter: one call, no driver.
    Python,
    /// `<interpreter> <src>` in one call, no driver.
    Direct { interpreter: &'static str },
    /// Through the driver: the tools in `needs` must exist; `compile` (if any) runs under
    /// the compile timeout, then `run` under the run timeout.
    Driver {
        needs: &'static [&'static str],
        compile: Option<&'static str>,
        run: &'static str,
    },
}

/// A language Warren serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Language {
    pub name: &'static str,
    /// The source file's name (`java` takes the public class's name instead).
    pub source: &'static str,
    pub toolchain: Toolchain,
}

const fn driver(
    name: &'static str,
    source: &'static str,
    needs: &'static [&'static str],
    compile: Option<&'static str>,
    run: &'static str,
) -> Language {
    Language {
        name,
        source,
        toolchain: Toolchain::Driver {
            needs,
            compile,
            run,
        },
    }
}

/// The languages Warren serves.
pub const LANGUAGES: &[Language] = &[
    Language {
        name: "python",
        source: "main.py",
        toolchain: Toolchain::Python,
    },
    Language {
        name: "bash",
        source: "main.sh",
        toolchain: Toolchain::Direct {
            interpreter: "bash",
        },
    },
    driver(
        "pytest",
        "test_main.py",
        &["python3"],
        None,
        "python3 -m pytest -q -p no:cacheprovider {src}",
    ),
    driver(
        "cpp",
        "main.cpp",
        &["g++"],
        Some("g++ -std=c++17 -O2 -o {bin} {src} -lm"),
        "./{bin}",
    ),
    driver(
        "c",
        "main.c",
        &["gcc"],
        Some("gcc -O2 -o {bin} {src} -lm"),
        "./{bin}",
    ),
    driver(
        "go",
        "main.go",
        &["go"],
        Some("go build -o {bin} {src}"),
        "./{bin}",
    ),
    driver(
        "rust",
        "main.rs",
        &["rustc"],
        Some("rustc -O -o {bin} {src}"),
        "./{bin}",
    ),
    driver(
        "java",
        "Main.java",
        &["javac", "java"],
        Some("javac -d . {src}"),
        "java -cp . {class}",
    ),
    driver("nodejs", "main.js", &["node"], None, "node {src}"),
    driver("php", "main.php", &["php"], None, "php {src}"),
    driver("perl", "main.pl", &["perl"], None, "perl {src}"),
    driver("ruby", "main.rb", &["ruby"], None, "ruby {src}"),
    driver("lua", "main.lua", &["lua"], None, "lua {src}"),
    driver("R", "main.R", &["Rscript"], None, "Rscript {src}"),
    driver("julia", "main.jl", &["julia"], None, "julia {src}"),
];

/// The served language of that name.
pub fn served(name: &str) -> Option<&'static Language> {
    LANGUAGES.iter().find(|l| l.name == name)
}

/// The public class of a Java source (`Main` when none is found): `javac` wants the file
/// named after it.
pub fn java_class(code: &str) -> String {
    let words: Vec<&str> = code
        .split(|c: char| c.is_whitespace() || c == '{')
        .filter(|w| !w.is_empty())
        .collect();
    for (i, w) in words.iter().enumerate() {
        if *w != "class" || i == 0 {
            continue;
        }
        let public = words[..i]
            .iter()
            .rev()
            .take_while(|m| matches!(**m, "public" | "final" | "abstract" | "static"))
            .any(|m| *m == "public");
        if !public {
            continue;
        }
        if let Some(name) = words.get(i + 1) {
            let ok = !name.is_empty()
                && name.len() <= 200
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
                && !name.starts_with(|c: char| c.is_ascii_digit());
            if ok {
                return (*name).to_string();
            }
        }
    }
    "Main".to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_served_language_is_known() {
        for l in LANGUAGES {
            assert!(known(l.name), "{}", l.name);
        }
        assert!(served("cobol").is_none() && !known("cobol"));
    }

    #[test]
    fn java_class_names() {
        assert_eq!(java_class("public class Solution { }"), "Solution");
        assert_eq!(java_class("import x;\npublic final class A{}"), "A");
        assert_eq!(java_class("class Helper {} public class Main {}"), "Main");
        assert_eq!(java_class("class Helper {}"), "Main");
        assert_eq!(java_class("public class ../x {}"), "Main");
        assert_eq!(java_class("public class"), "Main");
    }
}
