//! The signers against published vectors: Twilio's request-validator test vectors (from the
//! twilio-php and twilio-csharp SDK test suites, auth token `12345`) and the e-mail event HMAC.

use mock_providers::signing::{ting_signature, twilio_signature, verify_ting, verify_twilio};

const TOKEN: &str = "12345";
const URL: &str = "https://mycompany.com/myapp.php?foo=1&bar=2";

fn params() -> Vec<(&'static str, &'static str)> {
    // Deliberately not in sorted order: the signer sorts.
    vec![
        ("From", "+14158675309"),
        ("CallSid", "CA1234567890ABCDE"),
        ("To", "+18005551212"),
        ("Digits", "1234"),
        ("Caller", "+14158675309"),
    ]
}

#[test]
fn twilio_published_vectors_sign_exactly() {
    // (url as signed, expected signature)
    let cases = [
        (URL, "RSOYDt4T1cUTdK1PDd93/VVr8B8="),
        (
            "https://mycompany.com:443/myapp.php?foo=1&bar=2",
            "kvajT1Ptam85bY51eRf/AJRuM3w=",
        ),
        (
            "http://mycompany.com:80/myapp.php?foo=1&bar=2",
            "0ZXoZLH/DfblKGATFgpif+LLRf4=",
        ),
        (
            "http://mycompany.com:1234/myapp.php?foo=1&bar=2",
            "Zmvh+3yNM1Phv2jhDCwEM3q5ebU=",
        ),
        (
            "https://user:pass@mycompany.com/myapp.php?foo=1&bar=2",
            "CukzLTc1tT5dXEDIHm/tKBanW10=",
        ),
        (
            "https://user@mycompany.com/myapp.php?foo=1&bar=2",
            "2YRLlVAflCqxaNicjMpJcSTgzSs=",
        ),
        (
            "https://user:pass@mycompany.com:443/myapp.php?foo=1&bar=2",
            "ZQFR1PTIZXF2MXB8ZnKCvnnA+rI=",
        ),
        (
            "https://MyCompany.com/myapp.php?foo=1&bar=2",
            "g9IN/x4Cft2g517EjYvEvM/W7LU=",
        ),
        (
            "https://MyCompany.com:1234/myapp.php?foo=1&bar=2",
            "PCqOZm8cnu/L6+u5i5fuEd+Iac4=",
        ),
    ];
    for (url, want) in cases {
        assert_eq!(twilio_signature(TOKEN, url, &params()), want, "{url}");
    }
}

#[test]
fn twilio_vector_with_repeated_params() {
    let p = [
        ("Sid", "CA123"),
        ("SidAccount", "AC123"),
        ("Digits", "5678"),
        ("Digits", "1234"),
        ("Digits", "1234"),
    ];
    assert_eq!(
        twilio_signature(TOKEN, URL, &p),
        "IK+Dwps556ElfBT0I3Rgjkr1wJU="
    );
}

#[test]
fn twilio_verification_table() {
    let p = params();
    // (url presented to the verifier, signature, valid?)
    let cases = [
        (URL, "RSOYDt4T1cUTdK1PDd93/VVr8B8=", true),
        // Twilio's validators accept a signature over the URL with the port removed or added.
        (
            "https://mycompany.com:1234/myapp.php?foo=1&bar=2",
            "RSOYDt4T1cUTdK1PDd93/VVr8B8=",
            true,
        ),
        (URL, "kvajT1Ptam85bY51eRf/AJRuM3w=", true),
        (
            "http://mycompany.com/myapp.php?foo=1&bar=2",
            "0ZXoZLH/DfblKGATFgpif+LLRf4=",
            true,
        ),
        (URL, "FAIL", false),
        (URL, "", false),
        (
            "https://mycompany.com/myapp.php?foo=1&bar=3",
            "RSOYDt4T1cUTdK1PDd93/VVr8B8=",
            false,
        ),
    ];
    for (url, sig, want) in cases {
        assert_eq!(verify_twilio(TOKEN, url, &p, sig), want, "{url} {sig}");
    }
    let mut tampered = params();
    tampered[3].1 = "9999";
    assert!(!verify_twilio(
        TOKEN,
        URL,
        &tampered,
        "RSOYDt4T1cUTdK1PDd93/VVr8B8="
    ));
    assert!(!verify_twilio(
        "54321",
        URL,
        &p,
        "RSOYDt4T1cUTdK1PDd93/VVr8B8="
    ));
}

#[test]
fn ting_event_signature() {
    // HMAC-SHA256("key", "The quick brown fox jumps over the lazy dog"), the RFC 4231-style
    // example widely published (e.g. Wikipedia's HMAC article).
    let body = b"The quick brown fox jumps over the lazy dog";
    let want = "sha256=f7bc83f430538424b13298e6aa6fb143ef4d59a14946175997479dbc2d1a3cd8";
    assert_eq!(ting_signature("key", body), want);
    assert!(verify_ting("key", body, want));
    assert!(!verify_ting("other", body, want));
    assert!(!verify_ting("key", b"tampered", want));
}
