//! The `xdstap` binary; the command line lives in the library ([`xdstap_cli::main`]). The binary
//! owns the process, so it chooses the allocator: mimalloc, giving freed pages back to the
//! system as soon as they empty, in pages of 64 KiB rather than transparent huge pages of
//! 2 MiB. Measured with `cargo bench --bench storm` (docs/performance.md): after 10,000 nodes
//! came and went, the system allocator kept 3.1 KiB of RSS per gone node (about 1 KiB of it
//! live, the rest freed memory kept among live records), mimalloc so set about 1.9 KiB.

use std::process::ExitCode;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_purge_delay` in `mi_option_e` of the mimalloc libmimalloc-sys builds (3.x):
/// milliseconds before an emptied page goes back (1000 by default).
const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
/// `mi_option_allow_thp` there: whether it asks for transparent huge pages (1 by default).
const ALLOW_THP: libmimalloc_sys::mi_option_t = 43;

fn main() -> ExitCode {
    give_back_freed_pages();
    xdstap_cli::main()
}

/// Emptied pages go back at once, not a second later at the thread's next allocation (an idle
/// tap's threads allocate nothing, so a delay keeps them for good), and the process takes no
/// transparent huge pages, which would hold memory in 2 MiB pieces.
#[allow(unsafe_code)] // the library forbids it; three FFI calls, with their SAFETY notes
fn give_back_freed_pages() {
    // mimalloc's own variables, when set, win (mimalloc reads them at its start).
    let unset = |name: &str| std::env::var_os(name).is_none();
    // SAFETY: mi_option_set stores one option's value; it is called before any thread starts.
    unsafe {
        if unset("MIMALLOC_PURGE_DELAY") {
            libmimalloc_sys::mi_option_set(PURGE_DELAY, 0);
        }
        if unset("MIMALLOC_ALLOW_THP") {
            libmimalloc_sys::mi_option_set(ALLOW_THP, 0);
        }
    }
    // SAFETY: PR_SET_THP_DISABLE takes plain integers and changes only this process's flag.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}

#[cfg(test)]
mod tests {
    /// The option numbers name the options meant: their defaults are theirs.
    #[test]
    #[allow(unsafe_code)]
    fn the_options_set_are_purge_delay_and_allow_thp() {
        // SAFETY: reads two options' values.
        let (delay, thp) = unsafe {
            (
                libmimalloc_sys::mi_option_get(super::PURGE_DELAY),
                libmimalloc_sys::mi_option_get(super::ALLOW_THP),
            )
        };
        assert_eq!(
            (delay, thp),
            (1000, 1),
            "not mimalloc's purge delay and THP options"
        );
    }
}
