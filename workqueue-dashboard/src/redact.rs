//! [`redact`]: a server URL as it may be shown or logged.

/// `url` with its password (and user name) replaced by `***`: what may be shown or logged.
/// A password given as a query parameter (`?password=...`, `sslpassword=...`, as
/// PostgreSQL's URLs allow) is replaced too.
///
/// ```
/// use workqueue_dashboard::redact;
///
/// assert_eq!(redact("redis://:s3cret@cache:6379/0"), "redis://***@cache:6379/0");
/// assert_eq!(
///     redact("postgres://app@db/app?password=s3cret&sslmode=require"),
///     "postgres://***@db/app?password=***&sslmode=require"
/// );
/// ```
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let authority = match authority.rsplit_once('@') {
        Some((_, host)) => format!("***@{host}"),
        None => authority.to_owned(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let params: Vec<String> = query
                .split('&')
                .map(|param| match param.split_once('=') {
                    Some((key, _)) if key.to_ascii_lowercase().ends_with("password") => {
                        format!("{key}=***")
                    }
                    _ => param.to_owned(),
                })
                .collect();
            format!("{path}?{}", params.join("&"))
        }
        None => tail.to_owned(),
    };
    format!("{scheme}://{authority}{tail}")
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn passwords_are_replaced_wherever_the_url_holds_them() {
        assert_eq!(redact("redis://user:pw@host:1/0"), "redis://***@host:1/0");
        assert_eq!(redact("redis://host:1/0"), "redis://host:1/0");
        assert_eq!(
            redact("postgres://u:p@w@db:5432/app?sslmode=require"),
            "postgres://***@db:5432/app?sslmode=require",
            "the last @ ends the user information"
        );
        assert_eq!(
            redact("postgres://db?user=app&Password=x&sslpassword=y"),
            "postgres://db?user=app&Password=***&sslpassword=***"
        );
        assert_eq!(redact("not a url"), "not a url");
    }
}
