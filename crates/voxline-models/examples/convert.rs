//! Converts a CTranslate2 Whisper directory to a whisper.cpp ggml file:
//! `cargo run --release -p voxline-models --example convert -- CT2_DIR OUT.bin`
fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 3 {
        eprintln!("usage: convert CT2_DIR OUT.bin");
        std::process::exit(2);
    }
    match voxline_models::whisper_ggml::convert_dir(
        args[1].as_ref(),
        args[2].as_ref(),
        &mut |_, _| {},
    ) {
        Ok(s) => println!("{s:?}"),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    }
}
