//! Marking a result as partial (a `sweep` or `compare` stopped by a signal
//! or a failed run still prints and writes what it has): a banner line for
//! the text, and the same line as a comment in CSV and SVG (JSON documents
//! get a `partial` object from their command).

/// `doc` (CSV) with `banner` as a first `# ` comment line, if any.
pub(crate) fn csv_with_banner(doc: String, banner: Option<&str>) -> String {
    match banner {
        Some(b) => format!("# {b}\n{doc}"),
        None => doc,
    }
}

/// `doc` (SVG) with `banner` as an XML comment after its first tag, if any.
pub(crate) fn svg_with_banner(doc: String, banner: Option<&str>) -> String {
    let Some(b) = banner else { return doc };
    let note = format!("<!-- {} -->", b.replace("--", "- -"));
    match doc.find('>') {
        Some(i) => format!("{}\n{note}{}", &doc[..=i], &doc[i + 1..]),
        None => doc,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn banners_are_comments() {
        assert_eq!(
            csv_with_banner("a,b\n".into(), Some("PARTIAL: x")),
            "# PARTIAL: x\na,b\n"
        );
        assert_eq!(csv_with_banner("a,b\n".into(), None), "a,b\n");
        let svg = svg_with_banner("<svg a='1'><g/></svg>".into(), Some("PARTIAL: --x"));
        assert_eq!(svg, "<svg a='1'>\n<!-- PARTIAL: - -x --><g/></svg>");
    }
}
