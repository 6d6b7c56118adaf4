//! Empty: this package only names the crate whose sources carry the headers.
