//! Signed tokens for links and live connections (tracking pixels, click redirects, one-click
//! unsubscribe, the inbox's WebSocket): HMAC-SHA256 over a JSON payload, with an expiry, a
//! purpose (a token made for one use is refused for another), and a key id so keys can rotate:
//! the first key signs, every listed key verifies.
//!
//! Format: `base64url(payload) "." kid "." base64url(hmac(kid "." payload))`.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use hmac::{Hmac, Mac};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("malformed token")]
    Malformed,
    #[error("unknown signing key")]
    UnknownKey,
    #[error("bad signature")]
    BadSignature,
    #[error("token expired")]
    Expired,
    #[error("token made for another purpose")]
    WrongPurpose,
    #[error("no signing key is configured")]
    NoKey,
}

/// The signing keys: `(kid, secret)`, the first one signs.
#[derive(Clone, Default)]
pub struct Signer {
    keys: Vec<(String, Vec<u8>)>,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print secrets.
        f.debug_struct("Signer").field("kids", &self.keys.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>()).finish()
    }
}

#[derive(Serialize, Deserialize)]
struct Envelope<T> {
    /// Purpose.
    p: String,
    /// Expiry, seconds since the epoch.
    exp: i64,
    /// The claims.
    c: T,
}

impl Signer {
    pub fn new(keys: Vec<(String, Vec<u8>)>) -> Self {
        Self { keys: keys.into_iter().filter(|(k, s)| !k.is_empty() && !k.contains('.') && !s.is_empty()).collect() }
    }

    /// Parses `kid:secret,kid:secret` (the first signs).
    pub fn parse(spec: &str) -> Self {
        Self::new(
            spec.split(',')
                .filter_map(|pair| pair.trim().split_once(':'))
                .map(|(k, s)| (k.trim().to_owned(), s.trim().as_bytes().to_vec()))
                .collect(),
        )
    }

    pub fn is_configured(&self) -> bool {
        !self.keys.is_empty()
    }

    fn mac(secret: &[u8], kid: &str, payload: &str) -> Result<HmacSha256, TokenError> {
        let mut mac = HmacSha256::new_from_slice(secret).map_err(|_| TokenError::NoKey)?;
        mac.update(kid.as_bytes());
        mac.update(b".");
        mac.update(payload.as_bytes());
        Ok(mac)
    }

    pub fn sign<T: Serialize>(&self, purpose: &str, claims: &T, expires_at_s: i64) -> Result<String, TokenError> {
        let (kid, secret) = self.keys.first().ok_or(TokenError::NoKey)?;
        let json = serde_json::to_vec(&Envelope { p: purpose.to_owned(), exp: expires_at_s, c: claims })
            .map_err(|_| TokenError::Malformed)?;
        let payload = B64.encode(json);
        let tag = Self::mac(secret, kid, &payload)?.finalize().into_bytes();
        Ok(format!("{payload}.{kid}.{}", B64.encode(tag)))
    }

    /// Checks the signature (in constant time), the purpose and the expiry.
    pub fn verify<T: DeserializeOwned>(&self, purpose: &str, token: &str, now_s: i64) -> Result<T, TokenError> {
        let mut parts = token.split('.');
        let (Some(payload), Some(kid), Some(tag), None) = (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(TokenError::Malformed);
        };
        let (_, secret) = self.keys.iter().find(|(k, _)| k == kid).ok_or(TokenError::UnknownKey)?;
        let tag = B64.decode(tag).map_err(|_| TokenError::Malformed)?;
        Self::mac(secret, kid, payload)?.verify_slice(&tag).map_err(|_| TokenError::BadSignature)?;
        let json = B64.decode(payload).map_err(|_| TokenError::Malformed)?;
        let envelope: Envelope<T> = serde_json::from_slice(&json).map_err(|_| TokenError::Malformed)?;
        if envelope.p != purpose {
            return Err(TokenError::WrongPurpose);
        }
        if envelope.exp <= now_s {
            return Err(TokenError::Expired);
        }
        Ok(envelope.c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Claims {
        user: String,
    }

    fn claims() -> Claims {
        Claims { user: "u1".into() }
    }

    #[test]
    fn round_trip_and_refusals() {
        let s = Signer::parse("k1:secret-one");
        let t = s.sign("inbox", &claims(), 1_000).unwrap();
        assert_eq!(s.verify::<Claims>("inbox", &t, 999), Ok(claims()));
        assert_eq!(s.verify::<Claims>("inbox", &t, 1_000), Err(TokenError::Expired));
        assert_eq!(s.verify::<Claims>("unsubscribe", &t, 0), Err(TokenError::WrongPurpose));
        let forged = Signer::parse("k1:another-secret").sign("inbox", &claims(), 1_000).unwrap();
        assert_eq!(s.verify::<Claims>("inbox", &forged, 0), Err(TokenError::BadSignature));
        let mut tampered = t.clone();
        tampered.replace_range(0..1, if t.starts_with('e') { "f" } else { "e" });
        assert!(s.verify::<Claims>("inbox", &tampered, 0).is_err());
        assert_eq!(s.verify::<Claims>("inbox", "a.b", 0), Err(TokenError::Malformed));
        assert_eq!(Signer::default().sign("inbox", &claims(), 1), Err(TokenError::NoKey));
    }

    #[test]
    fn keys_rotate_old_tokens_stay_valid_until_the_key_is_dropped() {
        let old = Signer::parse("k1:first");
        let t = old.sign("click", &claims(), 100).unwrap();
        let rotated = Signer::parse("k2:second,k1:first");
        assert_eq!(rotated.verify::<Claims>("click", &t, 0), Ok(claims()));
        assert!(rotated.sign("click", &claims(), 100).unwrap().contains(".k2."));
        let dropped = Signer::parse("k2:second");
        assert_eq!(dropped.verify::<Claims>("click", &t, 0), Err(TokenError::UnknownKey));
    }

    #[test]
    fn debug_never_shows_secrets() {
        assert!(!format!("{:?}", Signer::parse("k1:supersecret")).contains("supersecret"));
    }
}
