//! Fuzz the readers of configured and received field values: `Accept-Encoding` negotiation (a
//! request field) and value templates with variables (redirects, header rules, rewrites).

#![no_main]

use libfuzzer_sys::fuzz_target;
use portico_config::{Captures, Template, Var, Vars};
use portico_http1::coding::{negotiate, Coding};

struct Fixed;

impl Vars for Fixed {
    fn write(&self, v: &Var, out: &mut String) {
        out.push_str(match v {
            Var::Capture(_) => "c",
            _ => "v",
        });
    }
}

fuzz_target!(|data: &[u8]| {
    if let Some(c) = negotiate(Some(data), &Coding::ALL) {
        assert!(Coding::ALL.contains(&c));
        // A coding the client accepts stays chosen when it is the only one offered.
        assert_eq!(negotiate(Some(data), &[c]), Some(c));
    }
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let names = [None, Some("id".to_string()), None];
    let captures = Some(Captures { names: &names });
    if let Ok(t) = Template::parse(text, captures) {
        let rendered = t.render(&Fixed);
        if let Some(lit) = t.as_literal() {
            assert_eq!(rendered, lit);
            assert!(!t.uses_captures());
        }
    }
});
