//! nftables through `libnftables`, the library behind the `nft` tool.
//!
//! One context is created once and reused: `nft -f -` costs ~20 ms per run on a small VM
//! (process start and cache setup), a batch through a kept context ~0.5 ms. The library is
//! opened at run time, so a host without it still builds and can fall back to the `nft`
//! binary (see [`Nft::open`]).

use std::ffi::{c_char, c_int, c_void, CStr, CString};

type CtxNew = unsafe extern "C" fn(u32) -> *mut c_void;
type CtxFree = unsafe extern "C" fn(*mut c_void);
type RunCmd = unsafe extern "C" fn(*mut c_void, *const c_char) -> c_int;
type BufferOut = unsafe extern "C" fn(*mut c_void) -> c_int;
type GetBuffer = unsafe extern "C" fn(*mut c_void) -> *const c_char;

/// Why nftables could not be used or refused a batch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NftError {
    /// `libnftables.so.1` is not installed or cannot be loaded.
    #[error("cannot load libnftables.so.1: {detail}")]
    Load { detail: String },
    /// The library lacks a function this module calls (another version).
    #[error("libnftables: {detail}")]
    Symbol { detail: String },
    /// The library could not make a context.
    #[error("nft_ctx_new failed")]
    Context,
    /// The batch holds a NUL byte, which the C interface cannot carry.
    #[error("nft commands contain NUL")]
    Nul,
    /// nftables refused the batch: its own error text, or its return code when it gave none.
    #[error("{}", refusal(*rc, message))]
    Refused { rc: i32, message: String },
}

fn refusal(rc: i32, message: &str) -> String {
    if message.is_empty() {
        format!("nft failed ({rc})")
    } else {
        message.to_string()
    }
}

/// A libnftables context. Not thread-safe by itself: callers serialize use (`&mut self`).
pub struct Nft {
    ctx: *mut c_void,
    run: RunCmd,
    free: CtxFree,
    get_error: GetBuffer,
    get_output: GetBuffer,
    // Keeps the functions above valid; dropped last.
    _lib: libloading::Library,
}

// SAFETY: the context is only used through `&mut self`, i.e. by one thread at a time, which
// libnftables allows (it keeps no thread-local state).
unsafe impl Send for Nft {}

impl std::fmt::Debug for Nft {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Nft(libnftables)")
    }
}

impl Nft {
    /// Opens `libnftables.so.1` and makes a context whose output and errors are buffered.
    pub fn open() -> Result<Nft, NftError> {
        // SAFETY: loading libnftables runs no initialisers with preconditions on us.
        let lib = unsafe { libloading::Library::new("libnftables.so.1") }.map_err(|e| {
            NftError::Load {
                detail: e.to_string(),
            }
        })?;
        // SAFETY: each symbol is looked up with the C signature documented in libnftables(3).
        let (new, free, run, buf_out, buf_err, get_out, get_err) = unsafe {
            let sym = |name: &[u8]| -> Result<*mut c_void, NftError> {
                lib.get::<*mut c_void>(name)
                    .map(|s| *s)
                    .map_err(|e| NftError::Symbol {
                        detail: e.to_string(),
                    })
            };
            (
                std::mem::transmute::<*mut c_void, CtxNew>(sym(b"nft_ctx_new\0")?),
                std::mem::transmute::<*mut c_void, CtxFree>(sym(b"nft_ctx_free\0")?),
                std::mem::transmute::<*mut c_void, RunCmd>(sym(b"nft_run_cmd_from_buffer\0")?),
                std::mem::transmute::<*mut c_void, BufferOut>(sym(b"nft_ctx_buffer_output\0")?),
                std::mem::transmute::<*mut c_void, BufferOut>(sym(b"nft_ctx_buffer_error\0")?),
                std::mem::transmute::<*mut c_void, GetBuffer>(sym(b"nft_ctx_get_output_buffer\0")?),
                std::mem::transmute::<*mut c_void, GetBuffer>(sym(b"nft_ctx_get_error_buffer\0")?),
            )
        };
        // SAFETY: NFT_CTX_DEFAULT (0) is a valid flag set; a null result is checked.
        let ctx = unsafe { new(0) };
        if ctx.is_null() {
            return Err(NftError::Context);
        }
        // SAFETY: ctx is a live context from nft_ctx_new.
        unsafe {
            buf_out(ctx);
            buf_err(ctx);
        }
        Ok(Nft {
            ctx,
            run,
            free,
            get_error: get_err,
            get_output: get_out,
            _lib: lib,
        })
    }

    /// Runs a batch of nft commands (`nft -f` syntax) as one transaction; returns the output
    /// (for `list` commands) or the error text.
    pub fn run(&mut self, commands: &str) -> Result<String, NftError> {
        let c = CString::new(commands).map_err(|_| NftError::Nul)?;
        // SAFETY: ctx is live, `c` outlives the call.
        let rc = unsafe { (self.run)(self.ctx, c.as_ptr()) };
        // SAFETY: the buffers belong to ctx and stay valid until the next run; copied now.
        let (out, err) = unsafe {
            let copy = |p: *const c_char| {
                if p.is_null() {
                    String::new()
                } else {
                    CStr::from_ptr(p).to_string_lossy().into_owned()
                }
            };
            (
                copy((self.get_output)(self.ctx)),
                copy((self.get_error)(self.ctx)),
            )
        };
        if rc == 0 {
            Ok(out)
        } else {
            Err(NftError::Refused {
                rc,
                message: err.trim().to_string(),
            })
        }
    }
}

impl Drop for Nft {
    fn drop(&mut self) {
        // SAFETY: ctx came from nft_ctx_new and is freed once.
        unsafe { (self.free)(self.ctx) }
    }
}
