//! The README's quickstart as the systemd pass runs it: the fenced blocks
//! of its `## Quickstart` section, in order.

/// The README, as this build of the tests was compiled with.
const README: &str = include_str!("../../README.md");

/// One fenced block: its language (`sh`, `yaml`, `hcl`) and its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    pub lang: String,
    pub text: String,
}

impl Block {
    /// The block's commands: its lines but blank ones and comments.
    pub fn commands(&self) -> Vec<&str> {
        self.text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect()
    }
}

/// The fenced blocks of the README's `## Quickstart`.
pub fn quickstart() -> Vec<Block> {
    blocks_of_section(README, "## Quickstart")
}

/// The fenced blocks between the line `heading` and the next heading of
/// its level (`## `).
pub fn blocks_of_section(markdown: &str, heading: &str) -> Vec<Block> {
    let mut lines = markdown
        .lines()
        .skip_while(|l| l.trim_end() != heading)
        .skip(1)
        .take_while(|l| !l.starts_with("## "));
    let mut out = Vec::new();
    while let Some(l) = lines.next() {
        // A block may be indented under a list item.
        let Some(lang) = l.trim_start().strip_prefix("```") else {
            continue;
        };
        let body: Vec<&str> = lines
            .by_ref()
            .take_while(|l| !l.trim_start().starts_with("```"))
            .collect();
        out.push(Block {
            lang: lang.trim().to_string(),
            text: body.join("\n") + "\n",
        });
    }
    out
}
