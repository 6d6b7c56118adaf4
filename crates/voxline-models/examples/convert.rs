//! Converts a CTranslate2 Whisper directory to a whisper.cpp ggml file,
//! optionally quantised:
//! `cargo run --release -p voxline-models --example convert -- CT2_DIR OUT.bin [q8_0|q4_0]`
fn main() {
    let args: Vec<String> = std::env::args().collect();
    if !(3..=4).contains(&args.len()) {
        eprintln!("usage: convert CT2_DIR OUT.bin [q8_0|q4_0]");
        std::process::exit(2);
    }
    let quant = match args.get(3).map(|q| q.parse()).transpose() {
        Ok(q) => q,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    match voxline_models::whisper_ggml::convert_dir_with(
        args[1].as_ref(),
        args[2].as_ref(),
        quant,
        &mut |_, _| {},
    ) {
        Ok(s) => println!("{s:?}"),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    }
}
