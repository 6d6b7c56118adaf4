//! `voxline models`: install, list and verify the models.

use voxline_models::fetch::{self, FetchEvent, FetchOptions, FileState};
use voxline_models::location::{self, ModelsDir, ModelsDirSource};
use voxline_models::registry;
use voxline_pipeline::BadInput;

use crate::cli::ModelsCommand;
use crate::Outcome;

pub(crate) fn models(command: ModelsCommand) -> anyhow::Result<Outcome> {
    match command {
        ModelsCommand::Fetch { dir, whisper_quant } => {
            let mut wanted = registry::PINNED.to_vec();
            if let Some(q) = whisper_quant {
                if !wanted.iter().any(|m| m.file == q.model().file) {
                    wanted.push(*q.model());
                }
            }
            let models_dir = location::resolve_from_process(dir.as_deref());
            let dir = models_dir.path.clone();
            let bar = indicatif::ProgressBar::new_spinner();
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} {prefix:.bold} {msg} {wide_bar} {percent:>3}%",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
            );
            bar.enable_steady_tick(std::time::Duration::from_millis(120));
            let results = fetch::fetch(&FetchOptions::new(&dir), &wanted, &mut |ev| match ev {
                FetchEvent::Step { file, what } => {
                    bar.set_prefix(file);
                    bar.set_message(what);
                    bar.set_length(1);
                    bar.set_position(0);
                }
                FetchEvent::Progress { done, total } => {
                    bar.set_length(total.max(1));
                    bar.set_position(done);
                }
                FetchEvent::Done { .. } => {}
            });
            bar.finish_and_clear();
            for (m, action) in results.map_err(|e| {
                anyhow::Error::new(BadInput::from_display(&e)).context("models fetch failed")
            })? {
                let what = match action {
                    fetch::FetchAction::Verified => "verified, nothing to do",
                    fetch::FetchAction::Installed => "installed",
                    fetch::FetchAction::Repaired => "repaired (was damaged or unrecorded)",
                };
                println!("{:<4} {:<36} {what}", m.role, m.file);
            }
            println!("{}", describe_models_dir(&models_dir));
            Ok(Outcome::Ok)
        }
        ModelsCommand::List { dir } => {
            let models_dir = location::resolve_from_process(dir.as_deref());
            let dir = models_dir.path.clone();
            let Some(manifest) = fetch::Manifest::load(&dir).map_err(BadInput::from_display)?
            else {
                println!(
                    "no models installed in {} ({}); run {}",
                    dir.display(),
                    models_dir.source,
                    fetch_command(&models_dir)
                );
                return Ok(Outcome::Ok);
            };
            println!("{}", describe_models_dir(&models_dir));
            println!(
                "{:<4} {:<36} {:>10}  {:<28} licence",
                "role", "file", "MB", "source"
            );
            for m in manifest.models {
                println!(
                    "{:<4} {:<36} {:>10.1}  {:<28} {}",
                    m.role,
                    m.file,
                    m.bytes as f64 / 1e6,
                    format!("{}=={}", m.source_package, m.source_version),
                    m.licence
                );
            }
            Ok(Outcome::Ok)
        }
        ModelsCommand::Verify { dir } => {
            let models_dir = location::resolve_from_process(dir.as_deref());
            let dir = models_dir.path;
            let results = fetch::verify(&dir).map_err(BadInput::from_display)?;
            let mut bad = 0;
            for (m, state) in results {
                let path = dir.join(&m.file);
                match state {
                    FileState::Ok => println!("ok       {}", path.display()),
                    FileState::Missing => {
                        bad += 1;
                        eprintln!("missing  {} — run `voxline models fetch`", path.display());
                    }
                    FileState::Mismatch { actual } => {
                        bad += 1;
                        eprintln!("CORRUPT  {}: sha256 {actual}, expected {} — run `voxline models fetch` to repair it", path.display(), m.sha256);
                    }
                }
            }
            Ok(if bad == 0 {
                Outcome::Ok
            } else {
                Outcome::BadInputSeen
            })
        }
    }
}

/// One line saying which models directory is used and why.
pub(crate) fn describe_models_dir(d: &ModelsDir) -> String {
    format!("models directory: {} ({})", d.path.display(), d.source)
}

/// The `models fetch` command that installs into `d`.
pub(crate) fn fetch_command(d: &ModelsDir) -> String {
    match d.source {
        ModelsDirSource::Flag => format!("`voxline models fetch --dir {}`", d.path.display()),
        _ => "`voxline models fetch`".into(),
    }
}
