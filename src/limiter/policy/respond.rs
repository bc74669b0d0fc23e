//! What a rule learns from the upstream's response: `count` (the statuses it charges),
//! `cost_from` (where its true cost is read) and `block_for` (how long a rejected key stays
//! out). Part of the rule's policy; `crate::limiter::reservation` holds the charges these
//! settle.

use std::time::Duration;

/// What a rule learns from the response. The default learns nothing: every admitted request
/// is charged its cost, whatever the answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Respond {
    /// `count = { status = [...] }`: only responses with these statuses are charged.
    pub count: Option<StatusSet>,
    /// `cost_from`: the request's true cost, read from the response.
    pub cost_from: Option<CostFrom>,
    /// `block_for`: once the rule rejects a key, the key is refused for this long.
    pub block_for: Option<Duration>,
}

impl Respond {
    /// Whether an admitted request's charge waits for its response.
    pub fn settles(&self) -> bool {
        self.count.is_some() || self.cost_from.is_some()
    }
}

/// Where a `cost_from` rule reads a request's true cost in the upstream's response.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum CostFrom {
    /// `header:NAME`: the header's integer value.
    Header(http::HeaderName),
    /// `json:a.b.c`: the number at this path of the JSON body (or, for `text/event-stream`,
    /// of the last `data:` event that has it).
    Json(Vec<String>),
}

impl CostFrom {
    /// `header:NAME` or `json:dotted.path`, or why not.
    pub fn parse(text: &str) -> Result<CostFrom, String> {
        if let Some(name) = text.strip_prefix("header:") {
            return http::HeaderName::from_bytes(name.as_bytes())
                .map(CostFrom::Header)
                .map_err(|_| format!("\"{name}\" is not a valid header name"));
        }
        if let Some(path) = text.strip_prefix("json:") {
            let parts: Vec<String> = path.split('.').map(str::to_owned).collect();
            if parts.iter().any(String::is_empty) {
                return Err(format!(
                    "\"{path}\" is not a dotted path such as usage.total_tokens"
                ));
            }
            return Ok(CostFrom::Json(parts));
        }
        Err("cost_from is \"header:NAME\" or \"json:dotted.path\"".into())
    }

    /// As gateway.toml writes it (`floodgate check` lists it so).
    pub fn to_config_string(&self) -> String {
        match self {
            CostFrom::Header(name) => format!("header:{name}"),
            CostFrom::Json(path) => format!("json:{}", path.join(".")),
        }
    }
}

/// The statuses a `count` rule charges: codes (`401`) and classes (`"4xx"`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusSet {
    entries: Vec<StatusMatch>,
}

/// One entry of a [`StatusSet`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusMatch {
    /// One status code, 100..=599.
    Code(u16),
    /// A class: `4` for `"4xx"`.
    Class(u16),
}

impl StatusMatch {
    /// An entry as written in gateway.toml: a code of 100..=599, or a class `"1xx"`..`"5xx"`.
    pub fn parse_class(text: &str) -> Option<StatusMatch> {
        match text.as_bytes() {
            [d @ b'1'..=b'5', b'x' | b'X', b'x' | b'X'] => {
                Some(StatusMatch::Class(u16::from(d - b'0')))
            }
            _ => None,
        }
    }
}

impl StatusSet {
    /// A set of these entries.
    pub fn new(entries: Vec<StatusMatch>) -> Self {
        StatusSet { entries }
    }

    /// The entries as gateway.toml writes them, e.g. `401, 403, 5xx` (`floodgate check`
    /// lists them so).
    pub fn to_config_string(&self) -> String {
        let entries: Vec<String> = self
            .entries
            .iter()
            .map(|e| match *e {
                StatusMatch::Code(c) => c.to_string(),
                StatusMatch::Class(k) => format!("{k}xx"),
            })
            .collect();
        entries.join(", ")
    }

    /// Whether `status` is charged.
    pub fn matches(&self, status: u16) -> bool {
        self.entries.iter().any(|e| match *e {
            StatusMatch::Code(c) => c == status,
            StatusMatch::Class(k) => status / 100 == k,
        })
    }
}
