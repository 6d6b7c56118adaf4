//! The binary's subcommands, one module each. The command tree and its
//! options are in `cli`; what the pipeline subcommands (`replay`, `bench`,
//! `live`) share, from the options checked to the report's end, is in
//! `session`.

pub(crate) mod bench;
pub(crate) mod live;
pub(crate) mod models;
pub(crate) mod replay;
pub(crate) mod serve;
pub(crate) mod session;
