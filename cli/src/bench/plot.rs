//! `bench --plot FILE.svg`: throughput against block size, drawn with plotters' SVG
//! backend (text is left to the SVG viewer: no fonts are read).

use plotters::prelude::*;

/// One series: a name and (block size in bytes, MB/s) points.
pub(crate) type Series<'a> = (&'a str, Vec<(u64, f64)>);

/// Draws the series on a log2 block-size axis into `path`.
pub(crate) fn sweep_svg(
    path: &std::path::Path,
    title: &str,
    series: &[Series<'_>],
) -> Result<(), String> {
    let max_y = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|&(_, y)| y))
        .fold(1.0f64, f64::max)
        * 1.1;
    let root = SVGBackend::new(path, (900, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(9f64..20f64, 0f64..max_y)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("request size")
        .y_desc("MB/s")
        .x_labels(12)
        .x_label_formatter(&|x| crate::bench::load::human(1u64 << (x.round() as u32)))
        .draw()
        .map_err(|e| e.to_string())?;
    let colors = [RED, BLUE, GREEN, MAGENTA];
    for (i, (name, pts)) in series.iter().enumerate() {
        let c = colors[i % colors.len()];
        let pts: Vec<(f64, f64)> = pts.iter().map(|&(b, y)| ((b as f64).log2(), y)).collect();
        chart
            .draw_series(LineSeries::new(pts, c.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    #[test]
    fn draws_an_svg_with_text() {
        let p = std::env::temp_dir().join(format!("tagstripe-plot-{}.svg", std::process::id()));
        super::sweep_svg(
            &p,
            "sweep",
            &[
                ("read", vec![(512, 1.0), (4096, 10.0), (1 << 20, 500.0)]),
                ("write", vec![(512, 2.0), (1 << 20, 400.0)]),
            ],
        )
        .unwrap();
        let s = std::fs::read_to_string(&p).unwrap().replace('\n', "");
        assert!(s.starts_with("<svg"), "{}", &s[..80.min(s.len())]);
        assert!(s.contains("<polyline") || s.contains("<path"), "no lines");
        assert!(s.contains(">1M<") && s.contains(">read<"), "labels missing");
        let _ = std::fs::remove_file(&p);
    }
}
