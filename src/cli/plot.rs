//! `sparkling plot`: SVG charts of `sparkling bench --json` results (issue 3): per-depth
//! conditional acceptance per method (the seeds' headline figure), τ per method, and budget vs
//! τ vs tokens/s; for `--budgets auto` rows, the calibration (predicted vs accepted per depth).

use clap::Args;
use plotters::prelude::*;
use sparkling::{Error, Result};
use std::path::{Path, PathBuf};

/// Arguments of `plot`.
#[derive(Args, Debug)]
pub struct PlotArgs {
    /// Bench results written by `sparkling bench --json` (repeat for several runs; each gets its
    /// own three charts, named after the file stem).
    #[arg(long, required = true)]
    pub input: Vec<PathBuf>,
    /// Output directory for the SVG files.
    #[arg(long)]
    pub out: PathBuf,
    /// Budget shown in the acceptance-by-depth and τ charts (default: the largest in the file).
    #[arg(long, allow_negative_numbers = true)]
    pub budget: Option<usize>,
}

/// One row of a bench JSON file.
#[derive(Debug, Clone)]
struct Row {
    method: String,
    budget: usize,
    tau: f64,
    tokens_per_s: f64,
    acceptance: Vec<f64>,
}

/// The `--budget auto` calibration of one bench row: per depth, the drafter's raw predicted
/// mass and the accepted count, summed over the rounds whose tree reached that depth.
#[derive(Debug, Clone)]
struct CalibRow {
    method: String,
    predicted: Vec<f64>,
    accepted: Vec<f64>,
}

/// A parsed bench file.
struct BenchFile {
    /// `--budgets auto` rows with calibration data.
    calib: Vec<CalibRow>,
    stem: String,
    temperature: f64,
    prompts: u64,
    max_new: u64,
    rows: Vec<Row>,
}

/// A row's series name: its method, with the lookup graft when the row has one (`bench
/// --lookup auto,off` runs a method twice at one budget: `sparkling` and `sparkling +lookup 6
/// fallback` are two series). `None` when the row has no `method`.
fn series(r: &serde_json::Value) -> Option<String> {
    let m = r["method"].as_str()?;
    Some(match r["lookup"].as_str() {
        None | Some("-") | Some("off") => m.to_string(),
        Some(l) => format!("{m} +lookup {l}"),
    })
}

fn read_bench(path: &Path) -> Result<BenchFile> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::file(path, e.to_string()))?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| Error::file(path, format!("not JSON: {e}")))?;
    let bad = |what: &str| Error::file(path, format!("not a `sparkling bench --json` file: {what}"));
    let rows = v["rows"].as_array().ok_or_else(|| bad("no `rows` array"))?;
    if rows.iter().any(|r| r.get("aggregate_tokens_per_s").is_some()) {
        return Err(Error::file(
            path,
            "a `sparkling bench --batch` file (aggregate tokens/s per batch size): `plot` draws the one-sequence bench's JSON (`bench --json` without `--batch`)",
        ));
    }
    let mut out = Vec::new();
    let mut calib = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        // Values a bench can produce: finite and non-negative (τ ≥ 0, tokens/s ≥ 0, budget ≥ 1);
        // anything else would draw an absurd chart (issue 15: τ = -1e308 wrote 300-digit
        // coordinates into the SVG).
        let num = |k: &str| {
            r[k].as_f64()
                .filter(|x| x.is_finite() && *x >= 0.0 && *x < 1e9)
                .ok_or_else(|| bad(&format!("row {i}: `{k}` is missing or not a number in 0..1e9 ({})", r[k])))
        };
        if r["budget"].as_str() == Some("auto") {
            // `--budgets auto` rows have no fixed budget to place on the budget axis; their
            // calibration gets its own chart.
            // Calibration masses are probabilities (a huge value spun the chart's axis forever).
            let nums = |k: &str| -> Result<Vec<f64>> {
                let v: Vec<f64> = r["stats"][k].as_array().map(|a| a.iter().filter_map(|x| x.as_f64()).collect()).unwrap_or_default();
                match v.iter().find(|x| !(x.is_finite() && (0.0..=1e6).contains(*x))) {
                    Some(x) => Err(bad(&format!("row {i}: `stats.{k}` holds {x}, not a probability mass"))),
                    None => Ok(v),
                }
            };
            let (predicted, accepted) = (nums("calib_predicted")?, nums("calib_accepted")?);
            if !predicted.is_empty() {
                let method = series(r).unwrap_or_else(|| "?".into());
                calib.push(CalibRow { method, predicted, accepted });
            }
            continue;
        }
        out.push(Row {
            method: series(r).ok_or_else(|| bad(&format!("row {i} has no `method`")))?,
            // `ar` rows carry budget 0 (no tree); every other method's is a tree budget ≥ 1.
            budget: Some(num("budget")?)
                .filter(|b| b.fract() == 0.0 && (*b >= 1.0 || r["method"].as_str() == Some("ar")))
                .ok_or_else(|| bad(&format!("row {i}: `budget` {} is not a tree budget (an integer ≥ 1)", r["budget"])))? as usize,
            tau: num("tau")?,
            tokens_per_s: num("tokens_per_s")?,
            acceptance: r["conditional_acceptance"].as_array().map(|a| a.iter().filter_map(|x| x.as_f64()).collect()).unwrap_or_default(),
        });
    }
    if out.is_empty() {
        return Err(bad("`rows` is empty"));
    }
    Ok(BenchFile {
        calib,
        stem: path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "bench".into()),
        temperature: v["temperature"].as_f64().unwrap_or(f64::NAN),
        prompts: v["prompts"].as_u64().unwrap_or(0),
        max_new: v["max_new_tokens"].as_u64().unwrap_or(0),
        rows: out,
    })
}

/// Methods in table order, those present in `rows`.
fn methods(rows: &[Row]) -> Vec<String> {
    let order = ["ar", "dflash", "ddtree", "dspark", "sparkling", "treespark", "lookup"];
    let mut m: Vec<String> = order.iter().filter(|o| rows.iter().any(|r| r.method == **o)).map(|s| s.to_string()).collect();
    for r in rows {
        if !m.contains(&r.method) {
            m.push(r.method.clone());
        }
    }
    m
}

fn color(i: usize) -> RGBColor {
    const C: [RGBColor; 6] =
        [RGBColor(90, 90, 90), RGBColor(31, 119, 180), RGBColor(255, 127, 14), RGBColor(44, 160, 44), RGBColor(214, 39, 40), RGBColor(148, 103, 189)];
    C[i % C.len()]
}

/// Run `plot`. Errors: unreadable or malformed JSON (naming the file), a `--budget` absent from
/// a file, an unwritable output directory.
pub fn run(a: PlotArgs) -> Result<()> {
    let files = a.input.iter().map(|p| read_bench(p)).collect::<Result<Vec<_>>>()?;
    for (i, f) in files.iter().enumerate() {
        if let Some(j) = files[..i].iter().position(|g| g.stem == f.stem) {
            return Err(Error::Input(format!(
                "--input {} and {} have the same file name `{}`: their charts would overwrite each other; rename one",
                a.input[j].display(),
                a.input[i].display(),
                f.stem
            )));
        }
    }
    if a.out.exists() && !a.out.is_dir() {
        return Err(Error::file(&a.out, "--out exists and is not a directory"));
    }
    std::fs::create_dir_all(&a.out).map_err(|e| Error::file(&a.out, format!("cannot create directory: {e}")))?;
    for (path, f) in a.input.iter().zip(&files) {
        let budgets: Vec<usize> = {
            let mut b: Vec<usize> = f.rows.iter().filter(|r| r.method != "ar").map(|r| r.budget).collect();
            b.sort_unstable();
            b.dedup();
            b
        };
        let budget = match a.budget {
            Some(b) if budgets.contains(&b) => b,
            Some(b) => return Err(Error::Input(format!("--budget {b} is not in {} (budgets there: {budgets:?})", path.display()))),
            None => budgets.last().copied().unwrap_or(0),
        };
        let title = format!("{} (T={}, {} prompts, ≤{} new tokens)", f.stem, f.temperature, f.prompts, f.max_new);
        let files = [
            (a.out.join(format!("{}-acceptance.svg", f.stem)), 0usize),
            (a.out.join(format!("{}-tau.svg", f.stem)), 1),
            (a.out.join(format!("{}-budget.svg", f.stem)), 2),
        ];
        for (file, kind) in &files {
            // Drawn into a temporary file renamed into place: never a half-written chart.
            sparkling::fsio::write_with(file, |tmp| {
                let r = match kind {
                    0 => acceptance_chart(tmp, f, budget, &title),
                    1 => tau_chart(tmp, f, budget, &title),
                    _ => budget_chart(tmp, f, &budgets, &title),
                };
                r.map_err(|e| Error::file(file, format!("cannot draw chart: {e}")))
            })?;
            eprintln!("wrote {}", file.display());
        }
        if !f.calib.is_empty() {
            let file = a.out.join(format!("{}-calibration.svg", f.stem));
            sparkling::fsio::write_with(&file, |tmp| calibration_chart(tmp, f, &title).map_err(|e| Error::file(&file, format!("cannot draw chart: {e}"))))?;
            eprintln!("wrote {}", file.display());
        }
    }
    Ok(())
}

/// `--budget auto` calibration per depth: the drafter's predicted mass of the verified nodes
/// (dashed) and the acceptances they earned (solid), per round that verified that depth.
fn calibration_chart(file: &Path, f: &BenchFile, title: &str) -> DrawResult {
    let root = SVGBackend::new(file, (820, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let max_d = f.calib.iter().map(|r| r.predicted.len()).max().unwrap_or(1).max(2);
    let top = f.calib.iter().flat_map(|r| r.predicted.iter().chain(&r.accepted)).fold(1.0f64, |m, &x| m.max(x)) * 1.1;
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("budget auto: predicted vs accepted per depth — {title}"), ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(0.5f64..max_d as f64 + 0.5, (0.01f64..top).log_scale())?;
    chart.configure_mesh().x_desc("depth d").y_desc("Σ over rounds (log)").x_labels(max_d.min(16)).x_label_formatter(&|x| format!("{x:.0}")).draw()?;
    let all: Vec<String> = f.calib.iter().map(|r| r.method.clone()).collect();
    for (i, r) in f.calib.iter().enumerate() {
        let c = color(all.iter().position(|m| *m == r.method).unwrap_or(i));
        let pred: Vec<(f64, f64)> = r.predicted.iter().enumerate().map(|(d, &p)| (d as f64 + 1.0, p.max(0.01))).collect();
        let acc: Vec<(f64, f64)> = r.accepted.iter().enumerate().map(|(d, &p)| (d as f64 + 1.0, p.max(0.01))).collect();
        chart
            .draw_series(LineSeries::new(acc, c.stroke_width(2)).point_size(3))?
            .label(format!("{} accepted", r.method))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
        chart
            .draw_series(DashedLineSeries::new(pred, 6, 4, c.stroke_width(1)))?
            .label(format!("{} predicted (raw)", r.method))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(1)));
    }
    chart.configure_series_labels().position(SeriesLabelPosition::UpperRight).background_style(WHITE.mix(0.85)).border_style(BLACK).draw()?;
    root.present()?;
    Ok(())
}

type DrawResult = std::result::Result<(), Box<dyn std::error::Error>>;

/// Per-depth conditional acceptance P(depth d accepted | depth d-1 accepted) per method.
fn acceptance_chart(file: &Path, f: &BenchFile, budget: usize, title: &str) -> DrawResult {
    let root = SVGBackend::new(file, (820, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let rows: Vec<&Row> = f.rows.iter().filter(|r| r.method != "ar" && r.budget == budget && !r.acceptance.is_empty()).collect();
    let max_d = rows.iter().map(|r| r.acceptance.len()).max().unwrap_or(1).max(2);
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("Conditional acceptance by depth, budget {budget} — {title}"), ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(0.5f64..max_d as f64 + 0.5, 0f64..1.02f64)?;
    chart.configure_mesh().x_desc("depth d").y_desc("P(accept d | accepted d-1)").x_labels(max_d.min(16)).x_label_formatter(&|x| format!("{x:.0}")).draw()?;
    let all = methods(&f.rows);
    for r in rows {
        let c = color(all.iter().position(|m| *m == r.method).unwrap_or(0));
        let pts: Vec<(f64, f64)> = r.acceptance.iter().enumerate().map(|(d, &p)| (d as f64 + 1.0, p)).collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)).point_size(3))?
            .label(format!("{} (τ {:.2})", r.method, r.tau))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
    }
    chart.configure_series_labels().position(SeriesLabelPosition::UpperRight).background_style(WHITE.mix(0.85)).border_style(BLACK).draw()?;
    root.present()?;
    Ok(())
}

/// τ (tokens committed per target forward, bonus included) per method at one budget, as bars.
fn tau_chart(file: &Path, f: &BenchFile, budget: usize, title: &str) -> DrawResult {
    let root = SVGBackend::new(file, (820, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let all = methods(&f.rows);
    let bars: Vec<(usize, &Row)> = all
        .iter()
        .enumerate()
        .filter_map(|(i, m)| f.rows.iter().find(|r| r.method == *m && (r.method == "ar" || r.budget == budget)).map(|r| (i, r)))
        .collect();
    let top = bars.iter().map(|(_, r)| r.tau).fold(1.0f64, f64::max) * 1.15;
    let names = all.clone();
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("τ per method, budget {budget} — {title}"), ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(-0.5f64..all.len() as f64 - 0.5, 0f64..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(all.len())
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 {
                names.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc("τ (tokens per target forward)")
        .draw()?;
    for (i, r) in bars {
        let c = color(i);
        let x = i as f64;
        chart.draw_series(std::iter::once(Rectangle::new([(x - 0.35, 0.0), (x + 0.35, r.tau)], c.filled())))?;
        chart.draw_series(std::iter::once(Text::new(format!("{:.2}", r.tau), (x - 0.15, r.tau + top * 0.02), ("sans-serif", 13))))?;
    }
    root.present()?;
    Ok(())
}

/// Two panels over the tree budget: τ (left) and decode tokens/s (right) per method, `ar` as a
/// dashed reference line.
fn budget_chart(file: &Path, f: &BenchFile, budgets: &[usize], title: &str) -> DrawResult {
    let root = SVGBackend::new(file, (1100, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(&format!("Budget vs τ vs tokens/s — {title}"), ("sans-serif", 16))?;
    let (left, right) = root.split_horizontally(550);
    let all = methods(&f.rows);
    let (bmin, bmax) = (*budgets.first().unwrap_or(&1) as f64, *budgets.last().unwrap_or(&64) as f64);
    let ar = f.rows.iter().find(|r| r.method == "ar");
    for (area, is_tau) in [(left, true), (right, false)] {
        let val = |r: &Row| if is_tau { r.tau } else { r.tokens_per_s };
        let top = f.rows.iter().map(val).fold(0.0f64, f64::max) * 1.1 + 1e-9;
        let mut chart = ChartBuilder::on(&area)
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(56)
            .build_cartesian_2d((bmin * 0.8..bmax * 1.25).log_scale(), 0f64..top)?;
        chart
            .configure_mesh()
            .x_desc("tree budget (non-root nodes)")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_desc(if is_tau { "τ (tokens per target forward)" } else { "decode tokens/s" })
            .draw()?;
        if let Some(a) = ar {
            let y = val(a);
            let grey = color(0);
            chart
                .draw_series(DashedLineSeries::new(vec![(bmin * 0.8, y), (bmax * 1.25, y)], 6, 4, grey.stroke_width(2)))?
                .label("ar")
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], grey.stroke_width(2)));
        }
        for (i, m) in all.iter().enumerate().filter(|(_, m)| *m != "ar") {
            let mut pts: Vec<(f64, f64)> = f.rows.iter().filter(|r| r.method == *m).map(|r| (r.budget as f64, val(r))).collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            let c = color(i);
            chart
                .draw_series(LineSeries::new(pts, c.stroke_width(2)).point_size(3))?
                .label(m.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
        }
        chart.configure_series_labels().position(SeriesLabelPosition::UpperLeft).background_style(WHITE.mix(0.85)).border_style(BLACK).draw()?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bench_json() -> serde_json::Value {
        let row = |m: &str, b: usize, tau: f64, tps: f64, acc: &[f64]| serde_json::json!({"method": m, "budget": b, "tau": tau, "tokens_per_s": tps, "conditional_acceptance": acc});
        serde_json::json!({"prompts": 2, "max_new_tokens": 64, "temperature": 0.0, "rows": [
            row("ar", 0, 1.0, 90.0, &[]),
            row("dspark", 16, 1.6, 30.0, &[0.5, 0.2]),
            row("sparkling", 16, 2.1, 40.0, &[0.7, 0.4, 0.1]),
            row("sparkling", 64, 2.5, 20.0, &[0.8, 0.5, 0.2]),
        ]})
    }

    #[test]
    fn rows_with_a_lookup_graft_are_their_own_series() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("six.json");
        let row = |lookup: &str, tau: f64| serde_json::json!({"method": "sparkling", "budget": 3, "lookup": lookup, "tau": tau, "tokens_per_s": 50.0});
        let v = serde_json::json!({"rows": [
            {"method": "ar", "budget": 0, "lookup": "-", "tau": 1.0, "tokens_per_s": 40.0},
            row("off", 1.57), row("6 fallback", 2.13),
        ]});
        std::fs::write(&input, v.to_string()).unwrap();
        let f = read_bench(&input).unwrap();
        let names: Vec<&str> = f.rows.iter().map(|r| r.method.as_str()).collect();
        assert_eq!(names, ["ar", "sparkling", "sparkling +lookup 6 fallback"]);
        assert_eq!(methods(&f.rows), ["ar", "sparkling", "sparkling +lookup 6 fallback"]);
    }

    #[test]
    fn writes_three_charts_with_the_methods_and_values() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("gsm8k-T0.json");
        std::fs::write(&input, bench_json().to_string()).unwrap();
        let out = dir.path().join("plots");
        run(PlotArgs { input: vec![input], out: out.clone(), budget: None }).unwrap();
        let acc = std::fs::read_to_string(out.join("gsm8k-T0-acceptance.svg")).unwrap();
        assert!(acc.starts_with("<svg") && acc.contains("sparkling (τ 2.50)") && acc.contains("budget 64"), "{}", &acc[..200.min(acc.len())]);
        let tau = std::fs::read_to_string(out.join("gsm8k-T0-tau.svg")).unwrap();
        assert!(tau.contains("2.50") && tau.contains("1.00"));
        let bud = std::fs::read_to_string(out.join("gsm8k-T0-budget.svg")).unwrap();
        assert!(bud.contains("dspark") && bud.contains("decode tokens/s"));
        // A budget that is not in the file is refused, naming the file.
        let e = run(PlotArgs { input: vec![dir.path().join("gsm8k-T0.json")], out: out.clone(), budget: Some(32) }).unwrap_err().to_string();
        assert!(e.contains("--budget 32") && e.contains("gsm8k-T0.json"), "{e}");
        // Two inputs with the same file name would overwrite each other's charts.
        std::fs::create_dir_all(dir.path().join("b")).unwrap();
        let twin = dir.path().join("b").join("gsm8k-T0.json");
        std::fs::write(&twin, bench_json().to_string()).unwrap();
        let e = run(PlotArgs { input: vec![dir.path().join("gsm8k-T0.json"), twin], out, budget: None }).unwrap_err().to_string();
        assert!(e.contains("same file name"), "{e}");
    }

    #[test]
    fn malformed_input_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("broken.json");
        std::fs::write(&input, r#"{"rows": [{"method": "ar"}]}"#).unwrap();
        let e = run(PlotArgs { input: vec![input.clone()], out: dir.path().join("p"), budget: None }).unwrap_err().to_string();
        assert!(e.contains("broken.json") && e.contains("budget"), "{e}");
        assert!(!dir.path().join("p").exists(), "a failed run must not leave an empty output directory");
        // Values no bench produces are refused, not drawn.
        std::fs::write(&input, r#"{"rows": [{"method": "ar", "budget": 1, "tau": -1e308, "tokens_per_s": 9}]}"#).unwrap();
        let e = run(PlotArgs { input: vec![input.clone()], out: dir.path().join("p"), budget: None }).unwrap_err().to_string();
        assert!(e.contains("`tau`") && e.contains("0..1e9"), "{e}");
        // A budget below 1 used to spin forever drawing the budget axis.
        std::fs::write(&input, r#"{"rows": [{"method": "sparkling", "budget": 0, "tau": 1.5, "tokens_per_s": 9}]}"#).unwrap();
        let e = run(PlotArgs { input: vec![input.clone()], out: dir.path().join("p"), budget: None }).unwrap_err().to_string();
        assert!(e.contains("`budget` 0 is not a tree budget"), "{e}");
    }
}
