//! The capacity report as Markdown and as a plot.

use plotters::prelude::*;

use super::CapacityReport;
use voxline_report::stats::cell;

/// The report as Markdown.
#[must_use]
pub fn to_markdown(r: &CapacityReport) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# voxline capacity\n\n{} thread(s) per engine call · users start {} ms apart · {} ms think time · fixtures: {}\n",
        r.threads,
        r.stagger_ms,
        r.think_ms,
        r.fixtures.join(", ")
    );
    let _ = writeln!(
        s,
        "| sessions | turns | errors | response p50 / p95 ms | STT p50 ms | STT queue p50 ms | LLM first token p50 ms | session decode tok/s p50 | aggregate decode tok/s | prefill tok/s | utilisation | saturating | within budget |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for row in &r.rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} / {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            row.sessions,
            row.turns,
            row.errors,
            cell(row.response_latency_ms.map(|p| p.p50), 0),
            cell(row.response_latency_ms.map(|p| p.p95), 0),
            cell(row.stt_ms.map(|p| p.p50), 0),
            cell(row.stt_queue_ms.map(|p| p.p50), 0),
            cell(row.llm_first_token_ms.map(|p| p.p50), 0),
            cell(row.session_decode_tps.map(|p| p.p50), 0),
            cell(row.aggregate_decode_tps, 0),
            cell(row.prefill_tps, 0),
            row.utilisation
                .iter()
                .map(|(stage, u)| format!("{stage} {u:.2}"))
                .collect::<Vec<_>>()
                .join(" · "),
            row.saturating_stage,
            match row.within_budget {
                Some(true) => "yes",
                Some(false) => "no",
                None => "–",
            }
        );
    }
    let _ = writeln!(
        s,
        "\ncapacity: {} · limiting stage: {}",
        r.capacity
            .map_or("none within the budget".into(), |c| format!(
                "{c} session(s)"
            )),
        match r.limiting_stage.as_deref() {
            Some(stage) => match r.remote_engines.get(stage) {
                Some(server) => format!("{stage} (remote, {server})"),
                None => stage.to_owned(),
            },
            None => "–".to_owned(),
        }
    );
    s
}

/// Latency (p50, p95) and aggregate tokens/s against the session count, as SVG.
///
/// # Errors
/// The drawing library's message when the plot cannot be drawn.
pub fn plot_svg(r: &CapacityReport) -> Result<String, String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (900, 360)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let (left, right) = root.split_horizontally(450);
        let max_n = r.rows.iter().map(|x| x.sessions).max().unwrap_or(1) as f64;
        let lat: Vec<(f64, f64, f64)> = r
            .rows
            .iter()
            .filter_map(|x| {
                x.response_latency_ms
                    .as_ref()
                    .map(|p| (x.sessions as f64, p.p50, p.p95))
            })
            .collect();
        let max_lat = lat.iter().map(|l| l.2).fold(1.0, f64::max) * 1.1;
        let mut c = ChartBuilder::on(&left)
            .caption("response latency (ms)", ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d(0.0..max_n + 1.0, 0.0..max_lat)
            .map_err(|e| e.to_string())?;
        c.configure_mesh()
            .x_desc("sessions")
            .draw()
            .map_err(|e| e.to_string())?;
        for (series, colour, label) in [(1, BLUE, "p50"), (2, RED, "p95")] {
            let pts: Vec<(f64, f64)> = lat
                .iter()
                .map(|l| (l.0, if series == 1 { l.1 } else { l.2 }))
                .collect();
            c.draw_series(LineSeries::new(pts.clone(), colour))
                .map_err(|e| e.to_string())?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], colour));
            c.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, colour.filled())))
                .map_err(|e| e.to_string())?;
        }
        c.configure_series_labels()
            .border_style(BLACK)
            .draw()
            .map_err(|e| e.to_string())?;
        let tps: Vec<(f64, f64)> = r
            .rows
            .iter()
            .filter_map(|x| x.aggregate_decode_tps.map(|t| (x.sessions as f64, t)))
            .collect();
        let max_tps = tps.iter().map(|t| t.1).fold(1.0, f64::max) * 1.1;
        let mut c = ChartBuilder::on(&right)
            .caption("aggregate decode tokens/s", ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d(0.0..max_n + 1.0, 0.0..max_tps)
            .map_err(|e| e.to_string())?;
        c.configure_mesh()
            .x_desc("sessions")
            .draw()
            .map_err(|e| e.to_string())?;
        c.draw_series(LineSeries::new(tps.clone(), GREEN))
            .map_err(|e| e.to_string())?;
        c.draw_series(tps.into_iter().map(|p| Circle::new(p, 3, GREEN.filled())))
            .map_err(|e| e.to_string())?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}
