/**
 * What the sign-in page says, as pure functions of what the console offers and where the
 * browser is: no DOM here, so the wording is tested without a browser (test/cloud/ui).
 * The page's shell carries the offer in its body's data attributes (src/cloud/ui/index.ts).
 */

/** SocialProvider is one of the two social providers the console may offer. */
export type SocialProvider = "github" | "google";

/** SOCIAL_LABELS name each provider on its button, in the order the buttons are drawn. */
export const SOCIAL_LABELS: Record<SocialProvider, string> = { github: "GitHub", google: "Google" };

/**
 * SIGN_IN_ENV are the variables an operator sets to turn sign-in on (src/cloud/config.ts reads
 * them; the README's engine-cloud section documents them): the three that must go together,
 * and the list of social providers the OpenID provider brokers.
 */
export const SIGN_IN_ENV = {
  required: ["ENGINE_CLOUD_OIDC_ISSUER", "ENGINE_CLOUD_OIDC_CLIENT_ID", "ENGINE_CLOUD_OIDC_CLIENT_SECRET"],
  social: "ENGINE_CLOUD_OIDC_SOCIAL_PROVIDERS",
} as const;

/** SignInOffer is what this console offers on its sign-in page. */
export interface SignInOffer {
  /** configured says whether an OpenID provider is configured at all. */
  configured: boolean;
  /** social are the social providers to show a button for, in SOCIAL_LABELS order. */
  social: SocialProvider[];
  /** publicUrl is where the console expects browsers; sign-in comes back there. */
  publicUrl: string;
}

/** readSignInOffer reads the offer from the shell's data attributes; anything unknown is left out. */
export function readSignInOffer(dataset: Record<string, string | undefined>): SignInOffer {
  const configured = dataset.signIn === "oidc";
  const listed = new Set((dataset.social ?? "").split(/\s+/));
  const social = configured ? (Object.keys(SOCIAL_LABELS) as SocialProvider[]).filter((provider) => listed.has(provider)) : [];
  return { configured, social, publicUrl: dataset.publicUrl ?? "" };
}

/** Text is a paragraph's pieces: plain text, or a `code` span (an env var, a URL to register). */
export type Text = (string | { code: string })[];

/** notConfiguredHelp tells the operator what to set when no OpenID provider is configured. */
export function notConfiguredHelp(publicUrl: string): Text[] {
  const [issuer, clientId, clientSecret] = SIGN_IN_ENV.required;
  return [
    ["Sign-in is not configured on this console yet, so nobody can sign in here."],
    [
      "The operator sets ",
      { code: issuer },
      ", ",
      { code: clientId },
      " and ",
      { code: clientSecret },
      " (the OpenID provider and the console's client there), registers ",
      { code: `${publicUrl}/api/auth/callback` },
      " and ",
      { code: `${publicUrl}/api/auth/social/callback` },
      " with that provider, and restarts engine-cloud. To offer GitHub or Google, also set ",
      { code: `${SIGN_IN_ENV.social}=github,google` },
      " (the providers the OpenID provider brokers).",
    ],
  ];
}

/** originOf is a URL's origin, or null for anything that is not an absolute http(s) URL. */
function originOf(url: string | null | undefined): string | null {
  if (!url) return null;
  try {
    const parsed = new URL(url);
    return parsed.protocol === "http:" || parsed.protocol === "https:" ? parsed.origin : null;
  } catch {
    return null;
  }
}

/**
 * hostMismatchText explains a failed sign-in that came back on another host than it started
 * on (`started_at` from the callback's redirect, `here` the page's own origin): the browser
 * keeps cookies per host name, so the sign-in's cookie stayed behind. Null when `startedAt` is
 * not an origin or names the same host. The fix it names is the console's public URL, which
 * comes from the server, never from the query.
 */
export function hostMismatchText(startedAt: string | null, here: string, publicUrl: string): string | null {
  const started = originOf(startedAt);
  if (!started || started !== startedAt || new URL(started).hostname === new URL(here).hostname) return null;
  return (
    `You started sign-in at ${started} but came back at ${here}: your browser keeps the sign-in cookie apart for each ` +
    `host name, so it did not send it here. Open the console at ${publicUrl} and sign in again.`
  );
}

/**
 * wrongHostText warns, before anything starts, when the page is open on another origin than
 * the console's public URL: the provider sends the browser back to the public URL, where the
 * cookie set here is not sent. Null when the page is where it should be.
 */
export function wrongHostText(here: string, publicUrl: string): string | null {
  const expected = originOf(publicUrl);
  if (!expected || expected === originOf(here)) return null;
  return `This console's address is ${publicUrl}. Sign-in started here comes back there and would fail: open ${publicUrl}/signin instead.`;
}
