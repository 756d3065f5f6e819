//! The `xdstap` binary; the command line lives in the library ([`xdstap::main`]).

fn main() -> std::process::ExitCode {
    xdstap::main()
}
