//! Where a VM's guest memory lives, and what a VM costs the host.
//!
//! A template's VM keeps its RAM in a file, `ram` of the template's directory
//! (`memory-backend-file`, `share=on`), and its snapshot is taken with the `x-ignore-shared`
//! migration capability: the RAM is not copied into the migration stream, it already is in
//! the file. Every VM restored from the template maps that file *privately*
//! (`readonly=on,rom=off,share=off`: opened read-only, copy-on-write), so the pages a guest
//! never writes after its restore are the file's page cache, shared by every VM of that
//! machine shape; only what a guest writes becomes its own (anonymous) memory. A VM booted
//! cold, or restored from a snapshot of a running sandbox (whose RAM is in the migration
//! stream), has anonymous RAM.
//!
//! A restore needs no kernel (the guest's memory holds the running one), but QEMU keeps the
//! `-kernel` file in its heap for the firmware: restores get a stub, the bzImage's setup
//! header and one page ([`stub_kernel`]), which cuts ~14 MiB from every restored VM.
//!
//! QEMU runs without transparent huge pages (see [`super::qemu::spawn`]): the anonymous RAM of a
//! VM restored from a snapshot of a running sandbox is then filled page by page, not 2 MiB at a
//! time, and holds what the snapshot held.
//!
//! This module must never write to a template's `ram` file after its snapshot was taken.

use std::path::{Path, PathBuf};

use crate::RuntimeError;

/// The id of the memory backend object (and so of its RAM block in migration streams).
pub const BACKEND_ID: &str = "ram";

/// The file of a template's guest memory, inside the template's directory.
pub const RAM_FILE: &str = "ram";

/// The guest's RAM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ram {
    /// Anonymous memory of the VMM.
    Anonymous,
    /// A file the VMM maps shared (a template's VM writes its memory into it).
    Shared(PathBuf),
    /// A template's file mapped copy-on-write (never written).
    Private(PathBuf),
}

impl Ram {
    /// The `-object` and `-machine memory-backend=` arguments.
    pub fn args(&self, memory_mb: u64) -> Vec<String> {
        let size = format!("size={memory_mb}M");
        let object = match self {
            Ram::Anonymous => format!("memory-backend-ram,id={BACKEND_ID},{size}"),
            Ram::Shared(p) => format!(
                "memory-backend-file,id={BACKEND_ID},{size},mem-path={},share=on",
                p.display()
            ),
            Ram::Private(p) => format!(
                "memory-backend-file,id={BACKEND_ID},{size},mem-path={},share=off,readonly=on,rom=off",
                p.display()
            ),
        };
        vec!["-object".into(), object]
    }

    /// The shared file, if the VM writes its memory into one.
    pub fn shared_file(&self) -> Option<&Path> {
        match self {
            Ram::Shared(p) => Some(p),
            _ => None,
        }
    }
}

/// Makes (once) and returns a stub of the bzImage `kernel` in `dir`: its real-mode setup
/// code and header, then one page. QEMU accepts it as `-kernel` of a restore (nothing boots
/// it: the guest's memory comes from the snapshot) and keeps ~20 KiB instead of the kernel.
pub fn stub_kernel(kernel: &Path, dir: &Path) -> Result<PathBuf, RuntimeError> {
    use std::io::Read as _;
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(kernel)
        .map_err(|e| RuntimeError::io(format!("stat {}", kernel.display()), e))?;
    let mut head = vec![0u8; 64 * 1024];
    let mut f = std::fs::File::open(kernel)
        .map_err(|e| RuntimeError::io(format!("open {}", kernel.display()), e))?;
    let n = f
        .read(&mut head)
        .map_err(|e| RuntimeError::io(format!("read {}", kernel.display()), e))?;
    head.truncate(n);
    // The boot protocol's header: "HdrS" at 0x202; setup sectors at 0x1f1 (0 means 4).
    if head.len() < 0x210 || &head[0x202..0x206] != b"HdrS" {
        return Err(RuntimeError::Vmm(crate::VmmError::NotBzImage(
            kernel.to_path_buf(),
        )));
    }
    let sects = match head[0x1f1] {
        0 => 4,
        s => s as usize,
    };
    let setup = (sects + 1) * 512;
    if setup > head.len() {
        return Err(RuntimeError::Vmm(crate::VmmError::SetupCode {
            kernel: kernel.to_path_buf(),
            setup,
        }));
    }
    let out = dir.join(format!("kernel-stub-{:x}-{:x}", meta.size(), meta.mtime()));
    if out.is_file() {
        return Ok(out);
    }
    let mut stub = head[..setup].to_vec();
    stub.resize(setup + 4096, 0);
    let tmp = out.with_extension(format!("tmp-{}", std::process::id()));
    std::fs::write(&tmp, &stub)
        .map_err(|e| RuntimeError::io(format!("write {}", tmp.display()), e))?;
    std::fs::rename(&tmp, &out)
        .map_err(|e| RuntimeError::io(format!("rename {}", out.display()), e))?;
    Ok(out)
}

/// Proportional memory (PSS) of a VMM process, split by what it is for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PssBreakdown {
    /// The guest's RAM mapping (shared template pages count a share each).
    pub guest_kib: u64,
    /// TCG's translation cache (the executable anonymous mapping); 0 under KVM.
    pub tcg_kib: u64,
    /// Everything else: QEMU's code, heap, device state, stacks.
    pub qemu_kib: u64,
    /// Of `guest_kib`: pages the guest wrote since its restore (private to this VM).
    pub guest_private_kib: u64,
    /// Of the guest's RAM mapping: resident pages shared with other processes (RSS).
    pub guest_shared_kib: u64,
}

impl PssBreakdown {
    pub fn total_kib(&self) -> u64 {
        self.guest_kib + self.tcg_kib + self.qemu_kib
    }
}

/// Reads `/proc/<pid>/smaps` of a VMM whose guest has `memory_mb` of RAM: the guest's RAM
/// is the one mapping of exactly that size (anonymous or a file named [`RAM_FILE`]).
pub fn pss_breakdown(pid: u32, memory_mb: u64) -> Result<PssBreakdown, RuntimeError> {
    let p = format!("/proc/{pid}/smaps");
    let text = std::fs::read_to_string(&p).map_err(|e| RuntimeError::io(format!("read {p}"), e))?;
    Ok(parse_smaps(&text, memory_mb))
}

#[derive(PartialEq)]
enum Kind {
    Guest,
    Tcg,
    Other,
}

fn parse_smaps(text: &str, memory_mb: u64) -> PssBreakdown {
    let mut out = PssBreakdown::default();
    let mut kind = Kind::Other;
    let kib = |l: &str| -> u64 {
        l.split_whitespace()
            .nth(1)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let first = f.next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-') {
            if let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) {
                let perms = f.next().unwrap_or("");
                let path = f.nth(3).unwrap_or("");
                let size_mb = (b - a) >> 20;
                kind = if size_mb == memory_mb
                    && (b - a) % (1 << 20) == 0
                    && (path.is_empty() || path.ends_with(&format!("/{RAM_FILE}")))
                {
                    Kind::Guest
                } else if perms.contains('x') && path.is_empty() {
                    Kind::Tcg
                } else {
                    Kind::Other
                };
                continue;
            }
        }
        if first == "Pss:" {
            let v = kib(line);
            match kind {
                Kind::Guest => out.guest_kib += v,
                Kind::Tcg => out.tcg_kib += v,
                Kind::Other => out.qemu_kib += v,
            }
        } else if kind == Kind::Guest && (first == "Private_Dirty:" || first == "Private_Clean:") {
            out.guest_private_kib += kib(line);
        } else if kind == Kind::Guest && (first == "Shared_Clean:" || first == "Shared_Dirty:") {
            out.guest_shared_kib += kib(line);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smaps_are_split_into_guest_tcg_and_vmm() {
        let smaps = "\
55b9fbcc6000-55b9fc15d000 r--p 00000000 fe:00 1 /usr/bin/qemu-system-x86_64
Size:               4700 kB
Pss:                4572 kB
7f4b9be00000-7f4babe00000 rw-p 00000000 fe:00 2 /var/lib/warren/vm/templates/abc/ram
Size:             262144 kB
Pss:               20000 kB
Shared_Clean:      70000 kB
Shared_Dirty:          0 kB
Private_Clean:         0 kB
Private_Dirty:      3000 kB
7f4bac000000-7f4baffff000 rwxp 00000000 00:00 0 
Size:              65532 kB
Pss:                6144 kB
7f4bbd077000-7f4bbde00000 rw-p 00000000 00:00 0 
Size:              13860 kB
Pss:               13860 kB
";
        let b = parse_smaps(smaps, 256);
        assert_eq!(
            b,
            PssBreakdown {
                guest_kib: 20000,
                tcg_kib: 6144,
                qemu_kib: 4572 + 13860,
                guest_private_kib: 3000,
                guest_shared_kib: 70000,
            }
        );
        assert_eq!(b.total_kib(), 20000 + 6144 + 4572 + 13860);
    }

    #[test]
    fn ram_backends_map_the_template_privately_and_read_only() {
        let a = Ram::Private("/t/ram".into()).args(256);
        assert_eq!(a[0], "-object");
        assert!(a[1].contains("mem-path=/t/ram,share=off,readonly=on,rom=off"));
        assert!(Ram::Shared("/s/ram".into()).args(256)[1].contains("share=on"));
        assert!(Ram::Anonymous.args(256)[1].starts_with("memory-backend-ram,id=ram,size=256M"));
    }

    #[test]
    fn a_stub_keeps_the_setup_header_and_refuses_other_files() {
        let d = tempfile::tempdir_in("/tmp").unwrap();
        let mut k = vec![0u8; 100_000];
        k[0x1f1] = 3;
        k[0x202..0x206].copy_from_slice(b"HdrS");
        std::fs::write(d.path().join("vmlinuz"), &k).unwrap();
        let s = stub_kernel(&d.path().join("vmlinuz"), d.path()).unwrap();
        let stub = std::fs::read(&s).unwrap();
        assert_eq!(stub.len(), 4 * 512 + 4096);
        assert_eq!(&stub[..4 * 512], &k[..4 * 512]);
        // Made once.
        assert_eq!(stub_kernel(&d.path().join("vmlinuz"), d.path()).unwrap(), s);
        std::fs::write(d.path().join("other"), b"not a kernel").unwrap();
        assert!(stub_kernel(&d.path().join("other"), d.path()).is_err());
    }
}
