//! Signatures on the delivery reports the fakes send: Twilio's `X-Twilio-Signature` and the
//! `X-Ting-Signature` of e-mail events.
//!
//! These must compute exactly what the real services compute, byte for byte, because a stack
//! under test verifies them with its own code (often Twilio's SDK). They never decide *whether*
//! to forge: that is [`crate::callbacks`]' job.

use base64::Engine;
use hmac::{Hmac, Mac};
use sha1::Sha1;
use sha2::Sha256;

/// Twilio's request signature: base64 of HMAC-SHA1 keyed with the auth token, over the full URL
/// followed by every POST parameter's name and value, sorted by name (then value), with exact
/// duplicate pairs counted once, as Twilio's SDK validators do.
pub fn twilio_signature<K: AsRef<str>, V: AsRef<str>>(
    auth_token: &str,
    url: &str,
    params: &[(K, V)],
) -> String {
    let mut pairs: Vec<(&str, &str)> = params
        .iter()
        .map(|(k, v)| (k.as_ref(), v.as_ref()))
        .collect();
    pairs.sort_unstable();
    pairs.dedup();
    let mut mac = Hmac::<Sha1>::new_from_slice(auth_token.as_bytes()).expect("hmac takes any key");
    mac.update(url.as_bytes());
    for (k, v) in pairs {
        mac.update(k.as_bytes());
        mac.update(v.as_bytes());
    }
    base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
}

/// Checks a Twilio signature the way Twilio's SDK validators do: against the URL as given, and
/// against the URL with its default port removed or added, since proxies disagree on it.
pub fn verify_twilio<K: AsRef<str>, V: AsRef<str>>(
    auth_token: &str,
    url: &str,
    params: &[(K, V)],
    signature: &str,
) -> bool {
    url_variants(url).iter().any(|u| {
        constant_eq(
            twilio_signature(auth_token, u, params).as_bytes(),
            signature.as_bytes(),
        )
    })
}

/// `url` as given, without its port, and with the scheme's default port.
fn url_variants(url: &str) -> Vec<String> {
    let mut out = vec![url.to_string()];
    let Some((scheme, rest)) = url.split_once("://") else {
        return out;
    };
    let default_port = match scheme.to_ascii_lowercase().as_str() {
        "https" => "443",
        "http" => "80",
        _ => return out,
    };
    let auth_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(auth_end);
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (format!("{u}@"), h),
        None => (String::new(), authority),
    };
    // An IPv6 literal has colons of its own; the port colon comes after the closing bracket.
    let port_colon = match hostport.rfind(']') {
        Some(b) => hostport[b..].find(':').map(|i| b + i),
        None => hostport.rfind(':'),
    };
    let host = match port_colon {
        Some(i) => &hostport[..i],
        None => hostport,
    };
    out.push(format!("{scheme}://{userinfo}{host}{tail}"));
    if port_colon.is_none() {
        out.push(format!("{scheme}://{userinfo}{host}:{default_port}{tail}"));
    }
    out
}

/// The `X-Ting-Signature` header value of an e-mail event: `sha256=` + hex HMAC-SHA256 of the
/// raw body keyed with the events secret.
pub fn ting_signature(secret: &str, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("hmac takes any key");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// Checks an `X-Ting-Signature` header value.
pub fn verify_ting(secret: &str, body: &[u8], header: &str) -> bool {
    constant_eq(
        ting_signature(secret, body).as_bytes(),
        header.trim().as_bytes(),
    )
}

fn constant_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_variants_add_and_remove_ports() {
        let cases: &[(&str, &[&str])] = &[
            (
                "https://a.com/x?y=1",
                &[
                    "https://a.com/x?y=1",
                    "https://a.com/x?y=1",
                    "https://a.com:443/x?y=1",
                ],
            ),
            (
                "http://a.com:1234/x",
                &["http://a.com:1234/x", "http://a.com/x"],
            ),
            (
                "http://u:p@a.com/",
                &[
                    "http://u:p@a.com/",
                    "http://u:p@a.com/",
                    "http://u:p@a.com:80/",
                ],
            ),
            (
                "http://[::1]:8080/cb",
                &["http://[::1]:8080/cb", "http://[::1]/cb"],
            ),
        ];
        for (url, want) in cases {
            assert_eq!(&url_variants(url), want, "url {url}");
        }
    }
}
