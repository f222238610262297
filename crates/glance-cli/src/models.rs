//! `glance models`: every model `--model` can name, and where it is.

use anyhow::Result;
use clap::Args;

#[derive(Args)]
pub struct ModelsArgs {
    /// Print JSON (one object per model: name, source, dir, note) instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: ModelsArgs) -> Result<()> {
    let found = glance_home::list()?;
    let home = glance_home::home()?;
    let cache = glance_home::hub::cache_dir();
    if args.json {
        let rows: Vec<serde_json::Value> = found
            .iter()
            .map(|f| {
                serde_json::json!({
                    "name": f.name,
                    "source": f.source.label(),
                    "dir": f.dir,
                    "note": f.note,
                })
            })
            .collect();
        let v = serde_json::json!({ "home": home, "hf_cache": cache, "models": rows });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!(
        "glance home: {} (${})",
        home.display(),
        glance_home::HOME_ENV
    );
    match &cache {
        Some(c) => println!("HF cache:    {}", c.display()),
        None => println!("HF cache:    none (no home directory; set HF_HUB_CACHE)"),
    }
    println!();
    let width = found.iter().map(|f| f.name.len()).max().unwrap_or(4).max(4);
    println!("{:width$}  {:11}  WHERE", "NAME", "SOURCE");
    for f in &found {
        let note = if f.note.is_empty() {
            String::new()
        } else {
            format!("  ({})", f.note)
        };
        println!(
            "{:width$}  {:11}  {}{note}",
            f.name,
            f.source.label(),
            f.dir.display()
        );
    }
    println!("\nAny model directory also loads by path: --model DIR.");
    Ok(())
}
